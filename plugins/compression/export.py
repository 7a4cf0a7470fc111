"""Storing a cleaned model with its weights as int8: what makes 8-bit quantization pay on disk.

``redundancy_clean`` leaves the quantized weights as float tensors whose values lie on a
symmetric 8-bit grid per group. ``pack_int8`` stores each such weight as ``int8`` levels plus
one float scale per group (a quarter of the fp32 bytes); ``unpack_int8`` rebuilds the float
state dict that ``load_state_dict`` of a plain model takes. Weights not on the grid are
requantized (then the round trip is the quantizer's, not exact), tensors of fewer than two
dimensions (biases, LayerNorm) stay as they are.
"""
import torch

SUFFIX_LEVELS = ".int8_levels"
SUFFIX_SCALE = ".int8_scale"


def pack_int8(state_dict, num_groups=1, keys=None):
    """``{name: tensor}`` -> the same with every chosen weight matrix split into int8 levels and
    per-group scales. ``keys`` (default: every floating tensor of 2+ dimensions whose size
    ``num_groups`` divides) picks the weights."""
    packed = {}
    for name, tensor in state_dict.items():
        chosen = keys is None and tensor.is_floating_point() and tensor.dim() >= 2 \
            and tensor.numel() % num_groups == 0
        if not (chosen or (keys is not None and name in keys)):
            packed[name] = tensor
            continue
        groups = tensor.detach().float().reshape(num_groups, -1)
        scale = _grid_scale(groups)
        levels = torch.clamp(torch.round(groups / scale), -128, 127).to(torch.int8)
        packed[name + SUFFIX_LEVELS] = levels.reshape(tensor.shape)
        packed[name + SUFFIX_SCALE] = scale.reshape(-1).to(tensor.dtype)
    return packed


def _grid_scale(groups):
    """Per group, the step of the 8-bit grid the values lie on: the largest magnitude is 128
    steps (a negative extreme) or 127 steps (a positive one, clamped); the candidate that makes
    every value a whole number of steps wins, else 128 (plain requantization)."""
    top = groups.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
    by_128, by_127 = top / 128, top / 127
    return torch.where(_on(groups, by_128), by_128,
                       torch.where(_on(groups, by_127), by_127, by_128))


def _on(groups, scale):
    ratio = groups / scale
    return ((ratio - ratio.round()).abs() < 1e-3).all(dim=1, keepdim=True)


def unpack_int8(packed, dtype=torch.float32):
    """The float state dict ``pack_int8`` came from (levels × scales)."""
    out = {}
    for name, tensor in packed.items():
        if name.endswith(SUFFIX_SCALE):
            continue
        if name.endswith(SUFFIX_LEVELS):
            base = name[:-len(SUFFIX_LEVELS)]
            scale = packed[base + SUFFIX_SCALE].float().reshape(-1, 1)
            groups = tensor.float().reshape(scale.shape[0], -1) * scale
            out[base] = groups.reshape(tensor.shape).to(dtype)
        else:
            out[name] = tensor
    return out
