"""Test support shipped with the package (`deepspeed.testing`), used by the project's own suite
and usable by plugin authors: multi-rank helpers in `distributed`, a pytest plugin in
`pytest_plugin`."""
from deepspeed.testing.distributed import (
    DistributedPool,
    DistributedTestError,
    DistributedTimeoutError,
    find_free_port,
    get_pool,
    run_distributed,
    shutdown_pools,
)

__all__ = ["DistributedPool", "DistributedTestError", "DistributedTimeoutError", "find_free_port",
           "get_pool", "run_distributed", "shutdown_pools"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
