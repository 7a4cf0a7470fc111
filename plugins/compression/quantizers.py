"""Fake quantization: tensors are rounded onto a k-bit grid and returned in their own dtype.

Every quantizer here is a ``torch.autograd.Function`` whose backward is the straight-through
estimator (the gradient passes unchanged), so quantization-aware training can learn through the
rounding. Groups: the tensor is flattened and split into ``num_groups`` equal rows, each with its
own scale (and zero point), as DeepSpeed's group-wise quantization does.

Formulas (DeepSpeed's MoQ quantizer):

- symmetric:  ``scale = 2·max|x| / 2^b``, ``q = clamp(round(x/scale + ξ), -2^(b-1), 2^(b-1)-1)·scale``
- asymmetric: ``scale = (max-min) / 2^b``, ``zp = round(min/scale)·scale``,
  ``q = clamp(round((x-zp)/scale + ξ), 0, 2^b-1)·scale + zp``
- ternary (2-bit XTC): ``α = 0.7·mean|x|``; values ``{-m, 0, m}`` with ``m`` the mean |x| above α
- binary (1-bit XTC): ``sign(x)·mean|x|``

ξ is 0 for nearest rounding and uniform in [-½, ½) for stochastic rounding, which makes the
rounding unbiased in expectation.
"""
import torch

ROUNDINGS = ("nearest", "stochastic")
TYPES = ("symmetric", "asymmetric")


def _grouped(x, num_groups):
    if x.numel() % num_groups:
        raise ValueError(f"cannot split a tensor of {x.numel()} elements (shape "
                         f"{tuple(x.shape)}) into quantize_groups={num_groups} equal groups")
    return x.reshape(num_groups, -1)


def _noise(x, rounding):
    if rounding == "nearest":
        return 0.0
    if rounding == "stochastic":
        return torch.rand_like(x) - 0.5
    raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")


def symmetric_quantize(x, bits, num_groups=1, rounding="nearest"):
    """Symmetric k-bit fake quantization per group (no autograd: see ``quantize``)."""
    g = _grouped(x.float(), num_groups)
    q_range = 2 ** bits
    scale = (2 * g.abs().amax(dim=1, keepdim=True) / q_range).clamp(min=1e-12)
    q = torch.clamp(torch.round(g / scale + _noise(g, rounding)), -q_range // 2, q_range // 2 - 1)
    return (q * scale).reshape(x.shape).to(x.dtype)


def asymmetric_quantize(x, bits, num_groups=1, rounding="nearest"):
    """Asymmetric (unsigned with a zero point) k-bit fake quantization per group."""
    g = _grouped(x.float(), num_groups)
    q_range = 2 ** bits
    low, high = g.amin(dim=1, keepdim=True), g.amax(dim=1, keepdim=True)
    scale = ((high - low) / q_range).clamp(min=1e-12)
    zero_point = torch.round(low / scale) * scale
    q = torch.clamp(torch.round((g - zero_point) / scale + _noise(g, rounding)), 0, q_range - 1)
    return (q * scale + zero_point).reshape(x.shape).to(x.dtype)


def ternary_quantize(x, num_groups=1):
    """Ternary XTC quantization: ``{-m, 0, +m}`` per group."""
    g = _grouped(x.float(), num_groups)
    threshold = 0.7 * g.abs().mean(dim=1, keepdim=True)
    keep = (g.abs() > threshold).float()
    magnitude = (g.abs() * keep).sum(dim=1, keepdim=True) / keep.sum(dim=1, keepdim=True).clamp(min=1)
    return (torch.sign(g) * keep * magnitude).reshape(x.shape).to(x.dtype)


def binary_quantize(x, num_groups=1):
    """Binary XTC quantization: ``sign(x)·mean|x|`` per group (0 maps to +m)."""
    g = _grouped(x.float(), num_groups)
    magnitude = g.abs().mean(dim=1, keepdim=True)
    sign = torch.where(g >= 0, torch.ones_like(g), -torch.ones_like(g))
    return (sign * magnitude).reshape(x.shape).to(x.dtype)


def quantize_tensor(x, bits, num_groups=1, quantization_type="symmetric", rounding="nearest"):
    """Dispatch on bits and type: 1 bit is binary, 2 bits ternary (as XTC and MoQ do), 16 or
    more returns ``x`` unchanged (MoQ's 16-bit start is "not quantized yet")."""
    bits = int(bits)
    if bits >= 16:
        return x
    if bits < 1:
        raise ValueError(f"quantization bits must be in 1..8 or 16, got {bits}")
    if bits == 1:
        return binary_quantize(x, num_groups)
    if bits == 2:
        return ternary_quantize(x, num_groups)
    if quantization_type == "symmetric":
        return symmetric_quantize(x, bits, num_groups, rounding)
    if quantization_type == "asymmetric":
        return asymmetric_quantize(x, bits, num_groups, rounding)
    raise ValueError(f"quantization_type must be one of {TYPES}, got {quantization_type!r}")


class _FakeQuantSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bits, num_groups, quantization_type, rounding):
        return quantize_tensor(x, bits, num_groups, quantization_type, rounding)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None, None


def quantize(x, bits, num_groups=1, quantization_type="symmetric", rounding="nearest"):
    """Fake-quantize ``x`` with a straight-through gradient."""
    return _FakeQuantSTE.apply(x, bits, num_groups, quantization_type, rounding)


def quantize_activation(x, bits, quantization_type="symmetric", value_range=None):
    """Activation fake quantization with a straight-through gradient.

    ``value_range`` None: dynamic ranges per token (every row of the last dimension gets its own
    scale). Otherwise ``(low, high)`` tensors: a static, calibrated range for the whole tensor.
    """
    return _ActivationSTE.apply(x, bits, quantization_type, value_range)


class _ActivationSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bits, quantization_type, value_range):
        if value_range is None:
            rows = x.reshape(-1, x.shape[-1]) if x.dim() > 1 else x.reshape(1, -1)
            return quantize_tensor(rows, bits, rows.shape[0], quantization_type).reshape(x.shape)
        low, high = (v.to(x.dtype) for v in value_range)
        q_range = 2 ** bits
        if quantization_type == "symmetric":
            scale = (2 * torch.maximum(low.abs(), high.abs()) / q_range).clamp(min=1e-12)
            q = torch.clamp(torch.round(x / scale), -q_range // 2, q_range // 2 - 1)
            return q * scale
        scale = ((high - low) / q_range).clamp(min=1e-12)
        zero_point = torch.round(low / scale) * scale
        q = torch.clamp(torch.round((x - zero_point) / scale), 0, q_range - 1)
        return q * scale + zero_point

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None
