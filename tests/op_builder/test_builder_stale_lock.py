"""A build lock left by a killed build must not hang every later load forever."""
import os
import time



def test_stale_lock_is_removed_and_a_fresh_one_kept(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    from deepspeed.ops.op_builder import CPUAdamBuilder

    builder = CPUAdamBuilder()
    build_dir = tmp_path / "cpu_adam"
    build_dir.mkdir()
    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda name, verbose: str(build_dir))
    lock = build_dir / "lock"
    lock.write_text("")
    builder._clear_stale_build_lock(cpp_extension)
    assert lock.exists()  # young: somebody may be building right now
    old = time.time() - 3600
    os.utime(lock, (old, old))
    builder._clear_stale_build_lock(cpp_extension)
    assert not lock.exists()
    lock.write_text("")
    os.utime(lock, (old, old))
    monkeypatch.setenv("DS_BUILD_LOCK_STALE_S", "7200")
    builder._clear_stale_build_lock(cpp_extension)
    assert lock.exists()


