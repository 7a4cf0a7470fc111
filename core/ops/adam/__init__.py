"""Adam for DeepSpeed (`deepspeed.ops.adam`): the multi-tensor FusedAdam and ZeRO-Offload's
DeepSpeedCPUAdam."""
from deepspeed.ops.adam.cpu_adam import DeepSpeedCPUAdam
from deepspeed.ops.adam.fused_adam import FusedAdam

__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]
