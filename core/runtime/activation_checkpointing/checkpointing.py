"""`deepspeed.runtime.activation_checkpointing.checkpointing` -> `deepspeed.activation_checkpointing`
(the module Megatron-DeepSpeed imports)."""
from deepspeed.activation_checkpointing import (  # noqa: F401
    CheckpointFunction, CudaRNGStatesTracker, checkpoint, configure, get_cuda_rng_tracker,
    is_configured, model_parallel_cuda_manual_seed, reset)
