"""pytest plugin for multi-rank tests: the `dist_pool` fixture and pool clean-up at session end.

Enable it in the root conftest (`pytest_plugins = ["deepspeed.testing.pytest_plugin"]`) or with
`pytest -p deepspeed.testing.pytest_plugin`. Then:

    def test_sum(dist_pool):
        assert dist_pool.run(_sum_of_ranks, world_size=2) == [1.0, 1.0]
"""
import pytest

from deepspeed.testing.distributed import DEFAULT_TIMEOUT, run_distributed, shutdown_pools


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


def pytest_sessionfinish(session, exitstatus):
    shutdown_pools()
