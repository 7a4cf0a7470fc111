"""The distributed test helper: rank set-up, results, failure and hang reports, pool recovery."""
import functools
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from deepspeed.testing.distributed import (DistributedPool, DistributedTestError,
                                           DistributedTimeoutError, run_distributed)


# --------------------------------------------------------------------------- in the ranks
def _rank_environment():
    import deepspeed.comm as dist

    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    return {"env": {name: os.environ.get(name) for name in names},
            "threads": torch.get_num_threads(), "initialized": dist.is_initialized(),
            "rank": dist.get_rank(), "size": dist.get_world_size()}


def _rank_echo(a, b, c=None):
    import deepspeed.comm as dist

    return (dist.get_rank(), a, b, c)


def _rank_getenv(name):
    return os.environ.get(name)


def _rank_fails_on_1():
    import deepspeed.comm as dist

    if dist.get_rank() == 1:
        raise ValueError("rank one broke")
    dist.barrier()  # rank 0 waits here for a rank that will never come


def _rank_1_starts_a_child_and_hangs(pid_file):
    import deepspeed.comm as dist

    if dist.get_rank() == 1:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(pid_file, "w") as handle:
            handle.write(str(child.pid))
        while True:
            time.sleep(0.05)
    return "done"


def _rank_crashes_on_1():
    import deepspeed.comm as dist

    if dist.get_rank() == 1:
        os._exit(7)
    return "survived"


def _rank_returns_unpicklable():
    return lambda: None


def _rank_destroys_group():
    import deepspeed.comm as dist

    dist.destroy_process_group()
    return dist.is_initialized()


# --------------------------------------------------------------------------- the shared pool
def test_each_rank_is_set_up_like_a_launched_worker():
    results = run_distributed(_rank_environment, world_size=2)
    ports = {got["env"]["MASTER_PORT"] for got in results}
    assert len(ports) == 1 and ports.pop().isdigit()
    for rank, got in enumerate(results):
        got["env"].pop("MASTER_PORT")
        assert got == {"env": {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                               "MASTER_ADDR": "127.0.0.1"},
                       "threads": 1, "initialized": True, "rank": rank, "size": 2}


def test_arguments_partials_and_results_in_rank_order():
    call = functools.partial(_rank_echo, "a")
    assert run_distributed(call, world_size=2, args=("b",), kwargs={"c": 3}) == [
        (0, "a", "b", 3), (1, "a", "b", 3)]


def test_env_overrides_last_for_one_call():
    assert run_distributed(_rank_getenv, args=("DS_HELPER_FLAG",),
                           env={"DS_HELPER_FLAG": "on"}) == ["on", "on"]
    assert run_distributed(_rank_getenv, args=("DS_HELPER_FLAG",)) == [None, None]


def test_functions_and_arguments_must_travel_by_name():
    with pytest.raises(TypeError, match="module level"):
        run_distributed(lambda: None)
    with pytest.raises(TypeError, match="must be picklable"):
        run_distributed(_rank_echo, args=(lambda: None, 1))


def test_function_from_a_module_the_ranks_cannot_import_by_name(tmp_path, monkeypatch):
    run_distributed(_rank_getenv, args=("HOME",))  # the pool exists before the module does
    (tmp_path / "ds_helper_gotcha.py").write_text(textwrap.dedent("""
        class Answer:
            def __init__(self, value):
                self.value = value

        def answer(x):
            import deepspeed.comm as dist
            return Answer(x * 10 + dist.get_rank())
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import ds_helper_gotcha

    results = run_distributed(ds_helper_gotcha.answer, args=(4,))
    assert [type(r).__name__ for r in results] == ["Answer", "Answer"]
    assert [r.value for r in results] == [40, 41]


def test_fresh_run_with_its_own_world_size_and_environment():
    assert run_distributed(_rank_getenv, world_size=1, fresh=True, args=("DS_HELPER_FLAG",),
                           env={"DS_HELPER_FLAG": "from start"}) == ["from start"]


# --------------------------------------------------------------------------- failures
@pytest.fixture(scope="module")
def fast_pool():
    """Failures tear the pool down; a forkserver pool restarts in well under a second."""
    with DistributedPool(2, start_method="forkserver", grace=1.0) as pool:
        yield pool


def test_a_failing_rank_is_reported_with_its_traceback(fast_pool):
    with pytest.raises(DistributedTestError) as info:
        fast_pool.run(_rank_fails_on_1, timeout=60)
    message = str(info.value)
    assert "_rank_fails_on_1 failed on rank(s) [1] of 2" in message
    assert "----- rank 1 -----" in message and 'raise ValueError("rank one broke")' in message
    assert "ValueError: rank one broke" in message
    assert "rank(s) [0] did not finish (stopped 1 s after the failure above" in message
    assert "----- stack of rank 0 when it was stopped -----" in message
    assert "in barrier" in message  # where rank 0 was waiting
    assert list(info.value.failures) == [1] and info.value.unfinished == [0]
    assert [r["rank"] for r in fast_pool.run(_rank_environment)] == [0, 1]  # restarted


def test_a_hung_rank_is_killed_at_the_timeout_with_what_it_started(fast_pool, tmp_path):
    """A rank stopped at the timeout is reported with its stack, and it takes its children
    along: it may be running a JIT build (ninja and compilers), which left running would
    compile beside the build the next test starts in the same directory. (One hung call for
    both checks: each timeout costs its full wait and a pool restart.)"""
    import psutil

    pid_file = tmp_path / "child.pid"
    with pytest.raises(DistributedTimeoutError) as info:
        fast_pool.run(_rank_1_starts_a_child_and_hangs, args=(str(pid_file),), timeout=3)
    message = str(info.value)
    assert ("_rank_1_starts_a_child_and_hangs: rank(s) [1] did not finish (killed at the 3 s "
            "timeout); rank(s) [0] finished.") in message
    assert "in _rank_1_starts_a_child_and_hangs" in message  # its stack
    assert info.value.unfinished == [1] and info.value.failures == {}
    child = int(pid_file.read_text())
    try:
        assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass  # gone, as it should be
    assert fast_pool.run(_rank_getenv, args=("RANK",)) == ["0", "1"]


def test_a_crashed_rank_and_an_unpicklable_result_are_failures(fast_pool):
    with pytest.raises(DistributedTestError, match=r"rank 1 exited with code 7"):
        fast_pool.run(_rank_crashes_on_1, timeout=60)
    with pytest.raises(DistributedTestError, match=r"(?s)rank\(s\) \[0, 1\].*pickle"):
        fast_pool.run(_rank_returns_unpicklable)
    assert fast_pool.run(_rank_getenv, args=("RANK",)) == ["0", "1"]


def test_a_destroyed_group_is_rebuilt_for_the_next_call(fast_pool):
    assert fast_pool.run(_rank_destroys_group) == [False, False]
    assert [got["initialized"] for got in fast_pool.run(_rank_environment)] == [True, True]


def test_bad_pool_settings():
    with pytest.raises(ValueError, match="start_method='fork'"):
        DistributedPool(2, start_method="fork")
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        DistributedPool(0)


# --------------------------------------------------------------------------- the pytest plugin
def test_pytest_plugin_provides_dist_pool(tmp_path):
    (tmp_path / "test_uses_pool.py").write_text(textwrap.dedent("""
        def _rank_plus(x):
            import deepspeed.comm as dist
            return dist.get_rank() + x

        def test_pool(dist_pool):
            assert dist_pool.run(_rank_plus, world_size=2, args=(10,)) == [10, 11]
    """))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "deepspeed.testing.pytest_plugin",
         "-p", "no:cacheprovider", str(tmp_path / "test_uses_pool.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
