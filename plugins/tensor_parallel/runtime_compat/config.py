"""``deepspeed.runtime.tensor_parallel.config`` (upstream path) -> ``deepspeed.tensor_parallel.config``."""
from deepspeed.tensor_parallel.config import TensorParallelTrainingConfig as TPTrainingConfig  # noqa: F401
from deepspeed.tensor_parallel.config import TPConfig  # noqa: F401
