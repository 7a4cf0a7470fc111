"""A build lock left by a killed build must not hang every later load forever, and separate
source trees must not share (and fight over) one build directory."""
import os
import subprocess
import sys
import time


def test_lock_of_a_dead_builder_is_removed_a_live_ones_kept(tmp_path):
    from deepspeed.ops.op_builder import CPUAdamBuilder

    builder = CPUAdamBuilder()
    lock = tmp_path / "lock"
    lock.write_text("")
    (tmp_path / "lock.owner").write_text(str(os.getpid()))  # alive: a build in progress
    builder._clear_stale_build_lock(str(tmp_path))
    assert lock.exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "lock.owner").write_text(str(dead.pid))
    builder._clear_stale_build_lock(str(tmp_path))
    assert not lock.exists() and not (tmp_path / "lock.owner").exists()


def test_ownerless_lock_is_removed_only_when_old(tmp_path, monkeypatch):
    from deepspeed.ops.op_builder import CPUAdamBuilder

    builder = CPUAdamBuilder()
    lock = tmp_path / "lock"
    lock.write_text("")
    builder._clear_stale_build_lock(str(tmp_path))
    assert lock.exists()  # young: somebody may be building right now
    old = time.time() - 3600
    os.utime(lock, (old, old))
    monkeypatch.setenv("DS_BUILD_LOCK_STALE_S", "7200")
    builder._clear_stale_build_lock(str(tmp_path))
    assert lock.exists()
    monkeypatch.delenv("DS_BUILD_LOCK_STALE_S")
    builder._clear_stale_build_lock(str(tmp_path))
    assert not lock.exists()


def test_each_source_tree_builds_in_its_own_directory(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    from deepspeed.ops.op_builder import CPUAdamBuilder
    from deepspeed.ops.op_builder import builder as builder_module

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setattr(cpp_extension, "_get_build_directory",
                        lambda name, verbose: str(tmp_path / name))
    first = CPUAdamBuilder().build_directory(cpp_extension)
    monkeypatch.setattr(builder_module, "CSRC_ROOT", tmp_path / "another" / "csrc")
    second = CPUAdamBuilder().build_directory(cpp_extension)
    assert first != second and os.path.basename(first) == "cpu_adam"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert CPUAdamBuilder().build_directory(cpp_extension) == str(tmp_path / "cpu_adam")
