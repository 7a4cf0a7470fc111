"""Training precision (`deepspeed.precision`): fp32, bf16 and fp16 with loss scaling.

`precision_for` reads the config once and returns the policy object the engine drives; see
`mixed_precision` for the protocol.
"""
import torch

from deepspeed.precision.loss_scaler import DynamicLossScaler, LossScaler, loss_scaler_from_config
from deepspeed.precision.mixed_precision import (BF16Optimizer, FP16Optimizer, FullPrecision,
                                                 MixedPrecisionOptimizer, OptimizerFace)
from deepspeed.precision.overflow import CheckOverflow

__all__ = ["training_dtype", "precision_for", "FullPrecision", "MixedPrecisionOptimizer",
           "FP16Optimizer", "BF16Optimizer", "OptimizerFace", "LossScaler", "DynamicLossScaler",
           "CheckOverflow", "check_precision_supported"]


def training_dtype(config):
    if config.fp16_enabled:
        return torch.float16
    if config.bfloat16_enabled:
        return torch.bfloat16
    return torch.float32


def check_precision_supported(config, accelerator):
    """Fail at initialize, naming the alternative, instead of deep inside the first forward."""
    if config.fp16_enabled and not accelerator.is_fp16_supported():
        raise ValueError(f"fp16.enabled: the '{accelerator.name}' accelerator cannot train in "
                         f"fp16; use \"bf16\": {{\"enabled\": true}} or fp32 instead")
    if config.bfloat16_enabled and not accelerator.is_bf16_supported():
        raise ValueError(f"bf16.enabled: the '{accelerator.name}' accelerator does not support "
                         f"bfloat16; use fp16 or fp32 instead")


def precision_for(config, module, optimizer, overflow_group=None):
    """The precision policy for `config`, wrapping `optimizer` when training in 16 bits.

    Returns ``(policy, optimizer to expose)``.
    """
    if optimizer is not None and config.fp16_master_weights_and_grads:
        raise ValueError(
            "fp16.fp16_master_weights_and_grads: true keeps the optimizer's master weights and "
            "gradients in fp16, which only ZeRO-Offload does (ZeRO stage 2 with the optimizer "
            "offloaded to the CPU and DeepSpeedCPUAdam); this run keeps fp32 masters, so "
            "enable that or remove the key")
    if optimizer is None or not (config.fp16_enabled or config.bfloat16_enabled):
        return FullPrecision(module, optimizer), optimizer
    scaler = loss_scaler_from_config(config) if config.fp16_enabled else None
    fp32_accumulation = config.grad_accum_dtype == "fp32"
    kind = FP16Optimizer if config.fp16_enabled else BF16Optimizer
    immediate = config.bfloat16_enabled and config.bfloat16_immediate_grad_update
    wrapped = kind(optimizer, loss_scaler=scaler, fp32_grad_accumulation=fp32_accumulation,
                   overflow_group=overflow_group, module=module, immediate_grad_update=immediate)
    return wrapped, wrapped

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
