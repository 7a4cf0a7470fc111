"""``deepspeed.inference.auto_tp``: AutoTP, which the ``tensor_parallel`` plugin owns (it splits
models for training too); this module keeps the inference plugin's older path."""
from deepspeed.tensor_parallel import (AutoTP, TensorParallelError,  # noqa: F401
                                       policy_from_injection, shard_block, shard_model)
