"""`deepspeed.checkpointing`, the documented name of activation checkpointing; the real home
is `deepspeed.activation_checkpointing`."""
from deepspeed.activation_checkpointing import (  # noqa: F401
    MODEL_PARALLEL_RNG_TRACKER_NAME, CheckpointFunction, CheckpointingSettings,
    CudaRNGStatesTracker, checkpoint, configure, get_cuda_rng_tracker, is_configured,
    model_parallel_cuda_manual_seed, reset)

__all__ = [
    "checkpoint", "CheckpointFunction", "configure", "is_configured", "reset",
    "get_cuda_rng_tracker", "CudaRNGStatesTracker", "model_parallel_cuda_manual_seed",
    "CheckpointingSettings", "MODEL_PARALLEL_RNG_TRACKER_NAME",
]
