"""pytest plugin for multi-rank tests: the `dist_pool` fixture and pool clean-up at session end,
and `--warm-python`, which runs the Python programs the tests start in forks of one warm
interpreter (`deepspeed.testing.warm_python`).

Enable it in the root conftest (`pytest_plugins = ["deepspeed.testing.pytest_plugin"]`) or with
`pytest -p deepspeed.testing.pytest_plugin`. Then:

    def test_sum(dist_pool):
        assert dist_pool.run(_sum_of_ranks, world_size=2) == [1.0, 1.0]
"""
import os

import pytest

from deepspeed.testing import warm_python
from deepspeed.testing.distributed import DEFAULT_TIMEOUT, run_distributed, shutdown_pools

# DS_TEST_WARM_PYTHON=0 turns --warm-python off without editing the command line
WARM_PYTHON_SWITCH = "DS_TEST_WARM_PYTHON"
_warm_stop = pytest.StashKey()


class DistPool:
    """What the `dist_pool` fixture gives a test: `run_distributed` on the session's warm pools."""

    def run(self, fn, world_size=2, timeout=DEFAULT_TIMEOUT, args=(), kwargs=None, env=None,
            fresh=False, init=True, init_kwargs=None):
        return run_distributed(fn, world_size=world_size, timeout=timeout, args=args,
                               kwargs=kwargs, env=env, fresh=fresh, init=init,
                               init_kwargs=init_kwargs)

    __call__ = run


@pytest.fixture(scope="session")
def dist_pool():
    yield DistPool()
    shutdown_pools()


def pytest_addoption(parser):
    parser.addoption(
        "--warm-python", action="store_true", default=False,
        help="run the Python programs tests start (launcher ranks, scripts) in forks of one "
             "interpreter that imported torch once (deepspeed.testing.warm_python); "
             f"{WARM_PYTHON_SWITCH}=0 turns it off")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fresh_python: the Python programs this test starts get fresh interpreters "
                   "even under --warm-python (a test of process identity: pids, parents, what a "
                   "new interpreter has imported)")
    # one server per session, started by the xdist controller (or the only process): the
    # workers inherit its variables
    if (config.getoption("warm_python") and not os.environ.get(warm_python.ENV)
            and os.environ.get(WARM_PYTHON_SWITCH, "1") != "0"):
        config.stash[_warm_stop] = warm_python.start_server()


@pytest.fixture(autouse=True)
def _fresh_python_for_marked_tests(request):
    # its own MonkeyPatch, and only for marked tests: taking the test's `monkeypatch` here would
    # set it up before every other autouse fixture and so undo the test's patches after theirs
    if request.node.get_closest_marker("fresh_python") is None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        warm_python.detach(patch)
        yield


def pytest_unconfigure(config):
    stop = config.stash.get(_warm_stop, None)
    if stop is not None:
        stop()


def pytest_sessionfinish(session, exitstatus):
    shutdown_pools()
