"""Weight-only int8 inference (``init_inference(dtype=torch.int8)``).

Every Linear-like layer (``nn.Linear``, AutoTP's ``LinearLayer`` / ``LinearAllreduce``, the
vocabulary-parallel LM head) keeps its weight as int8 codes plus one fp32 scale per group, and
dequantizes it when its forward reads ``weight`` (a ``torch.nn.utils.parametrize``
parametrization, so the layers' own forwards are unchanged). Activations, biases, norms and
embeddings stay in the compute dtype (the model's float dtype). A weight shared with another
module (a LM head tied to the embedding) stays float.

Groups: each output row is cut into ``q_groups`` equal groups of input weights
(``quant.weight.q_groups``; the default 1 is one scale per row). Symmetric (the default):
``code = round(w / s)`` with ``s = max|w| / 127`` per group, so ``|w - s*code| <= s / 2`` and a
layer's output error is at most ``sum_j |x_j| * s_group(i, j) / 2`` per output ``i``
(``output_error_bound``). Asymmetric adds a per-group zero point (``s = (max - min) / 255``).
Weights take a quarter of their fp32 bytes (plus 4 bytes of scale per group).

``quant`` (``QuantizationConfig``) chooses what is quantized: ``quant.enabled: false`` keeps the
model in float; ``quant.weight.enabled: false`` keeps the weights float; ``quant.qkv.enabled:
false`` keeps the attention's query/key/value projections float (``QKV_NAMES``); with
``quant.activation.enabled`` (the default) each quantized layer's input is quantized on the fly
too (``fake_quantize``: per token, in ``activation.q_groups`` groups of its features, to
``activation.num_bits`` bits, symmetric or asymmetric), so the layer computes on the values an
int8 kernel would see.
"""
import torch
from torch import nn
from torch.nn.utils import parametrize

from deepspeed.inference.vocab_parallel import VocabParallelLMHead
from deepspeed.tensor_parallel import LinearAllreduce, LinearLayer

QUANTIZABLE = (nn.Linear, LinearLayer, LinearAllreduce, VocabParallelLMHead)
# the attention input projections ``quant.qkv.enabled: false`` leaves in float
QKV_NAMES = ("q_proj", "k_proj", "v_proj", "qkv_proj", "query", "key", "value",
             "query_key_value", "c_attn", "Wqkv", "in_proj")


def _grouped(weight, q_groups):
    out, inp = weight.shape
    return weight.reshape(out, q_groups, inp // q_groups)


def quantize(weight, q_groups=1, symmetric=True):
    """``(int8 codes shaped like weight, scales [out, q_groups], zero points or None)``."""
    g = _grouped(weight.detach().float(), q_groups)
    if symmetric:
        scale = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127.0
        codes = torch.round(g / scale).clamp(-127, 127)
        zero = None
    else:
        low, high = g.amin(dim=-1, keepdim=True), g.amax(dim=-1, keepdim=True)
        scale = (high - low).clamp(min=1e-12) / 255.0
        zero = torch.round(-low / scale) - 128  # code of 0.0, so w = (code - zero) * scale
        codes = torch.round(g / scale + zero).clamp(-128, 127)
        zero = zero.squeeze(-1)
    return codes.to(torch.int8).reshape(weight.shape), scale.squeeze(-1), zero


def dequantize(codes, scale, zero=None, dtype=torch.float32):
    g = _grouped(codes, scale.shape[1]).float()
    if zero is not None:
        g = g - zero.unsqueeze(-1)
    return (g * scale.unsqueeze(-1)).reshape(codes.shape).to(dtype)


class Int8Weight(nn.Module):
    """The parametrization: ``right_inverse`` turns the float weight into ``(int8 codes,
    scales[, zero points])`` once (kept by the parametrization as ``original0``,
    ``original1``, ...), ``forward`` turns them back into a weight on every read."""

    def __init__(self, q_groups=1, symmetric=True, dtype=torch.float32):
        super().__init__()
        self.q_groups, self.symmetric, self.dtype = q_groups, symmetric, dtype

    def right_inverse(self, weight):
        codes, scale, zero = quantize(weight, self.q_groups, self.symmetric)
        return (codes, scale) if zero is None else (codes, scale, zero)

    def forward(self, codes, scale, zero=None):
        return dequantize(codes, scale, zero, self.dtype)


def int8_parts(module):
    """``(codes, scales, zero points or None)`` of a quantized layer, else None."""
    p = getattr(getattr(module, "parametrizations", None), "weight", None)
    if p is None or not isinstance(p[0], Int8Weight):
        return None
    return p.original0, p.original1, getattr(p, "original2", None)


def output_error_bound(x, scale):
    """The largest possible ``|y - y_int8|`` of a symmetric layer per output, for input ``x``
    (``[..., in]``) and the layer's scales ``[out, q_groups]``."""
    groups = scale.shape[1]
    xs = x.abs().reshape(*x.shape[:-1], groups, x.shape[-1] // groups).sum(-1)  # [..., groups]
    return (xs.unsqueeze(-2) * scale).sum(-1) / 2  # [..., out]


def fake_quantize(x, num_bits=8, q_groups=1, symmetric=True):
    """``x`` rounded to ``num_bits``-bit codes and back, per row of its last dimension cut into
    ``q_groups`` groups (dynamic activation quantization: the scale follows each token)."""
    g = x.float().reshape(*x.shape[:-1], q_groups, x.shape[-1] // q_groups)
    if symmetric:
        top = 2 ** (num_bits - 1) - 1
        scale = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / top
        out = torch.round(g / scale).clamp(-top, top) * scale
    else:
        low, high = g.amin(dim=-1, keepdim=True), g.amax(dim=-1, keepdim=True)
        scale = (high - low).clamp(min=1e-12) / (2 ** num_bits - 1)
        out = torch.round((g - low) / scale) * scale + low
    return out.reshape(x.shape).to(x.dtype)


class _QuantizeInput:
    """Forward pre-hook quantizing a layer's input (``quant.activation``)."""

    def __init__(self, activation):
        self.num_bits, self.q_groups = activation.num_bits, activation.q_groups
        self.symmetric = activation.q_type.value == "symmetric"

    def __call__(self, module, args):
        if not args or not torch.is_tensor(args[0]) or not args[0].is_floating_point():
            return None
        return (fake_quantize(args[0], self.num_bits, self.q_groups, self.symmetric),
                *args[1:])


def _check(quant):
    activation = quant.activation
    if activation.enabled and not 2 <= activation.num_bits <= 8:
        raise ValueError(f"quant.activation.num_bits={activation.num_bits} is not supported "
                         f"(2 to 8 bits)")
    if activation.enabled and activation.q_groups < 1:
        raise ValueError(f"quant.activation.q_groups={activation.q_groups} must be >= 1")
    weight = quant.weight
    if weight.num_bits != 8:
        raise ValueError(f"quant.weight.num_bits={weight.num_bits} is not supported by "
                         f"dtype=torch.int8 (weight-only int8 needs 8)")
    if weight.q_groups < 1:
        raise ValueError(f"quant.weight.q_groups={weight.q_groups} must be >= 1")


def quantize_model(model, quant):
    """Quantize ``model``'s Linear-like layers in place as ``quant`` (``QuantizationConfig``)
    says; returns ``{name: (fp32 bytes before, int8 bytes + scale bytes after)}``."""
    _check(quant)
    if not quant.enabled:
        return {}
    q_groups = quant.weight.q_groups
    symmetric = quant.weight.q_type.value == "symmetric"
    quantize_input = _QuantizeInput(quant.activation) if quant.activation.enabled else None
    owners = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    counted = {}
    for name, module in model.named_modules():
        if not isinstance(module, QUANTIZABLE) or parametrize.is_parametrized(module):
            continue
        if not quant.qkv.enabled and name.rsplit(".", 1)[-1] in QKV_NAMES:
            continue
        weight = module.weight
        if weight.dim() != 2 or not weight.is_floating_point() or owners[id(weight)] > 1:
            continue
        if quantize_input is not None:
            if weight.shape[1] % quant.activation.q_groups:
                raise ValueError(f"quant.activation.q_groups={quant.activation.q_groups} does "
                                 f"not divide the {weight.shape[1]} input features of {name}")
            module.register_forward_pre_hook(quantize_input)
        if not quant.weight.enabled:
            continue
        if weight.shape[1] % q_groups:
            raise ValueError(f"quant.weight.q_groups={q_groups} does not divide the "
                             f"{weight.shape[1]} input features of {name}; choose a divisor")
        before = weight.numel() * 4
        weight.requires_grad_(False)  # an int8 parameter cannot require grad
        parametrize.register_parametrization(
            module, "weight", Int8Weight(q_groups, symmetric, weight.dtype), unsafe=True)
        after = sum(t.numel() * t.element_size() for t in int8_parts(module) if t is not None)
        counted[name] = (before, after)
    return counted
