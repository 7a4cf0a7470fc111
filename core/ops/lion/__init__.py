"""Lion for DeepSpeed (`deepspeed.ops.lion`): the multi-tensor FusedLion and ZeRO-Offload's
DeepSpeedCPULion."""
from deepspeed.ops.lion.cpu_lion import DeepSpeedCPULion
from deepspeed.ops.lion.fused_lion import FusedLion

__all__ = ["DeepSpeedCPULion", "FusedLion"]
