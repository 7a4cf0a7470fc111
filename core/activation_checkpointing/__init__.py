"""Activation checkpointing (`deepspeed.checkpointing`): recompute segments in backward instead
of keeping their activations, with the memory options of the `activation_checkpointing` config
section (partitioning across model-parallel ranks, contiguous buffers, host offload) and the
model-parallel RNG streams that make recomputed dropout match.

    deepspeed.checkpointing.configure(mpu, deepspeed_config="ds_config.json")
    deepspeed.checkpointing.model_parallel_cuda_manual_seed(1234)
    hidden = deepspeed.checkpointing.checkpoint(layer, hidden, attention_mask)

settings.py holds configure(); rng.py the RNG streams; storage.py and buffers.py what is kept of
a segment's inputs; function.py the autograd function itself.
"""
from deepspeed.activation_checkpointing.function import CheckpointFunction, checkpoint
from deepspeed.activation_checkpointing.rng import (MODEL_PARALLEL_RNG_TRACKER_NAME,
                                                    CudaRNGStatesTracker, get_cuda_rng_tracker,
                                                    model_parallel_cuda_manual_seed)
from deepspeed.activation_checkpointing.settings import (CheckpointingSettings, configure,
                                                         is_configured, reset)

__all__ = [
    "checkpoint", "CheckpointFunction", "configure", "is_configured", "reset",
    "get_cuda_rng_tracker", "CudaRNGStatesTracker", "model_parallel_cuda_manual_seed",
    "CheckpointingSettings", "MODEL_PARALLEL_RNG_TRACKER_NAME",
]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
