"""Adagrad for DeepSpeed (`deepspeed.ops.adagrad`): ZeRO-Offload's DeepSpeedCPUAdagrad."""
from deepspeed.ops.adagrad.cpu_adagrad import DeepSpeedCPUAdagrad

__all__ = ["DeepSpeedCPUAdagrad"]
