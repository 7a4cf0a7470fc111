"""MixZ++: frozen (``requires_grad=False``) weights *stored* quantized.

Each frozen, non-persistent ZeRO-3 parameter's shard becomes int8 with one fp32 scale per
``WEIGHT_BLOCK`` elements (about 1/4 of fp32, 1/2 of bf16/fp16); its ``ds_tensor`` becomes an
empty placeholder. Gathers move the stored bytes as they are (no quantization at run time) and
dequantize into the parameter's dtype. The engine does this at ``initialize`` with
``zero_quantized_nontrainable_weights``; ``optimizer.quantize_nontrainable_params()`` does it
again for weights frozen later (LoRA applied after ``initialize``).
"""
import torch

from deepspeed.hooks import PARAM_STATE_ACCESS
from deepspeed.zero.param_access import SHARD_ONLY_ACCESS

from deepspeed.zero.zeropp.quantize import WEIGHT_BLOCK, quantize_packed


def is_stored_quantized(param):
    return getattr(param, "ds_quantized", None) is not None


def quantize_frozen(params):
    """Quantize the shards of the frozen parameters among ``params``; returns how many.
    Skipped: persistent ones (whole anyway), and any an optimizer owns (it would step and
    write back into the shard)."""
    done = 0
    with torch.no_grad():
        for param in params:
            if param.requires_grad or not hasattr(param, "ds_id") or param.ds_persist \
                    or is_stored_quantized(param) \
                    or getattr(param, PARAM_STATE_ACCESS, None) is not SHARD_ONLY_ACCESS:
                continue
            shard = param.ds_partitioner.fetch(param)
            param.ds_quantized = quantize_packed(shard, WEIGHT_BLOCK)
            param.ds_quantized_numel = shard.numel()
            param.ds_tensor = torch.empty(0, dtype=shard.dtype, device=shard.device)
            done += 1
    return done


def store_full(partitioner, param, full):
    """Load a whole tensor into a weight stored quantized: this rank's piece, re-quantized
    (and the full data too where it is resident)."""
    with torch.no_grad():
        size = param.ds_quantized_numel
        flat = full.reshape(-1)
        start = min(partitioner.rank * size, param.ds_numel)
        piece = torch.zeros(size, dtype=param.dtype, device=param.ds_quantized.device)
        piece[:min(size, param.ds_numel - start)] = flat[start:start + size]
        param.ds_quantized = quantize_packed(piece, WEIGHT_BLOCK)
        if param.data.numel() == param.ds_numel and param.data.data_ptr() != full.data_ptr():
            param.data.copy_(full.reshape(param.ds_shape))


def stored_bytes(param):
    """Bytes a frozen parameter's shard occupies (quantized or not)."""
    if is_stored_quantized(param):
        return param.ds_quantized.numel()
    return param.ds_tensor.numel() * param.ds_tensor.element_size()
