"""How data-parallel gradients are averaged: the dtype they travel in and where the 1/N goes.

Shared by the core's all-reduce and by plugins that reduce gradients themselves (ZeRO's
reduce-scatter), so ``communication_data_type``, ``prescale_gradients`` and
``gradient_predivide_factor`` mean the same thing whichever collective carries the gradients.
"""
import torch

COMM_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
               "bfp16": torch.bfloat16}


def communication_dtype(config, grad_dtype):
    """``communication_data_type`` when set, else the gradients' own dtype."""
    return COMM_DTYPES.get(config.communication_data_type, grad_dtype)


def scale_before_reduce(flat, config):
    """Pre-divide (in place) when ``prescale_gradients`` is on, to keep fp16 sums in range."""
    if config.prescale_gradients:
        flat.div_(config.gradient_predivide_factor)
    return flat


def scale_after_reduce(flat, config, world_size):
    """Finish the average (in place): the reduced sum times whatever of 1/N is left."""
    predivide = config.gradient_predivide_factor if config.prescale_gradients else 1.0
    flat.mul_(predivide / world_size)
    return flat
