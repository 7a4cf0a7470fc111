"""``deepspeed.runtime.tensor_parallel`` (upstream path) -> ``deepspeed.tensor_parallel``."""
from deepspeed.tensor_parallel.config import TensorParallelTrainingConfig as TPTrainingConfig  # noqa: F401
from deepspeed.tensor_parallel.config import TPConfig  # noqa: F401

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
