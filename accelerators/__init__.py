"""Accelerator abstraction (`deepspeed.accelerator`): one API over CUDA, CPU and plugged-in devices."""
from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
from deepspeed.accelerator.real_accelerator import (
    get_accelerator,
    is_current_accelerator_supported,
    reset_accelerator,
    set_accelerator,
)
from deepspeed.accelerator.registry import installed_accelerators, installed_op_builders

__all__ = [
    "DeepSpeedAccelerator",
    "get_accelerator",
    "set_accelerator",
    "is_current_accelerator_supported",
    "reset_accelerator",
    "installed_accelerators",
    "installed_op_builders",
]
