"""A build lock left by a killed build must not hang every later load forever, and different
sources must not share (and fight over) one build directory, while the same sources do."""
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


def test_the_build_directory_is_named_by_the_sources_not_the_checkout(tmp_path, monkeypatch):
    """Two checkouts of the same sources share one build (a fresh clone compiles nothing);
    different sources never share one (no rebuilding each other's op)."""
    import shutil

    from torch.utils import cpp_extension

    from deepspeed.ops.op_builder import CPUAdamBuilder
    from deepspeed.ops.op_builder import builder as builder_module

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setattr(cpp_extension, "_get_build_directory",
                        lambda name, verbose: str(tmp_path / "root" / name))

    def directory():
        op = CPUAdamBuilder()
        kwargs = op._jit_kwargs()
        return op.build_directory(cpp_extension, op._source_stamp(op.absolute_sources(), kwargs))

    first = directory()
    assert os.path.dirname(first) == str(tmp_path / "root" / "deepspeed")
    assert os.path.basename(first).startswith("cpu_adam-")
    clone = tmp_path / "clone" / "csrc"
    shutil.copytree(builder_module.CSRC_ROOT, clone)
    monkeypatch.setattr(builder_module, "CSRC_ROOT", clone)
    assert directory() == first  # the same sources elsewhere
    source = clone / CPUAdamBuilder().sources()[0]
    source.write_text(source.read_text() + "\n// changed\n")
    assert directory() != first
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert directory() == str(tmp_path / "root" / "cpu_adam")
