"""`deepspeed.runtime.fp16.fused_optimizer` -> `deepspeed.precision`: the optimizer an fp16
engine exposes (fp32 masters, loss scaling) is an ``FP16_Optimizer``."""
from deepspeed.precision.mixed_precision import FP16Optimizer as FP16_Optimizer

__all__ = ["FP16_Optimizer"]
