"""`deepspeed.runtime.bf16_optimizer` -> `deepspeed.precision`: the optimizer a bf16 engine
exposes (fp32 masters) is a ``BF16_Optimizer``."""
from deepspeed.precision.mixed_precision import BF16Optimizer as BF16_Optimizer

__all__ = ["BF16_Optimizer"]
