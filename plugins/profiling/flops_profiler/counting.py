"""How many flops and MACs each profiled torch op costs.

``op_rules`` names every op the profiler wraps (``torch_patches`` does the wrapping) with the rule
that prices it. Each rule receives the op's output followed by the op's own arguments and
returns ``(flops, macs)``. Conventions: a multiply-accumulate is 2 flops; a linear layer's bias
add is not counted (matmul-style ops report 2·MACs), a convolution's is; element-wise ops
(activations, pooling, softmax, add/mul) cost one flop per element and no MACs.
"""
import math

import torch
import torch.nn.functional as F


def _numel(shape):
    return int(math.prod(shape))


def _elementwise(out, input, *args, **kwargs):
    return int(input.numel()), 0


def _output_elementwise(out, *args, **kwargs):
    return int(out.numel()) if torch.is_tensor(out) else 0, 0


def _linear(out, input, weight, bias=None):
    macs = int(input.numel()) * int(weight.shape[0])
    return 2 * macs, macs


def _check_conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    in_channels = input.shape[1] if input.dim() == weight.dim() else input.shape[0]
    assert in_channels == weight.shape[1] * groups, (
        f"conv input has {in_channels} channels but the weight {tuple(weight.shape)} with "
        f"groups={groups} expects {weight.shape[1] * groups}")


def _conv(out, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    batched = input.dim() == weight.dim()
    out_shape = out.shape if batched else (1,) + tuple(out.shape)
    positions = out_shape[0] * _numel(out_shape[2:])
    macs = positions * _numel(weight.shape)  # C_out * (C_in / groups) * prod(kernel) each
    bias_flops = positions * weight.shape[0] if bias is not None else 0
    return 2 * macs + bias_flops, macs


def _check_conv_transpose(input, weight, *args, **kwargs):
    in_channels = input.shape[1] if input.dim() == weight.dim() else input.shape[0]
    assert in_channels == weight.shape[0], (
        f"conv_transpose input has {in_channels} channels but the weight "
        f"{tuple(weight.shape)} expects {weight.shape[0]}")


def _conv_transpose(out, input, weight, bias=None, stride=1, padding=0, output_padding=0,
                    groups=1, dilation=1):
    batched = input.dim() == weight.dim()
    in_shape = input.shape if batched else (1,) + tuple(input.shape)
    # every input position scatters C_out/groups * prod(kernel) products
    macs = in_shape[0] * _numel(in_shape[2:]) * _numel(weight.shape)
    out_shape = out.shape if batched else (1,) + tuple(out.shape)
    bias_flops = out_shape[0] * _numel(out_shape[2:]) * out_shape[1] if bias is not None else 0
    return 2 * macs + bias_flops, macs


def _matmul(out, input, other, *args, **kwargs):
    inner = input.shape[-1]
    macs = int(out.numel()) * int(inner)
    return 2 * macs, macs


def _addmm(out, input, mat1, mat2, *args, **kwargs):
    macs = int(mat1.shape[0]) * int(mat1.shape[1]) * int(mat2.shape[1])
    return 2 * macs + int(input.numel()), macs


def _baddbmm(out, input, batch1, batch2, *args, **kwargs):
    macs = _numel(batch1.shape) * int(batch2.shape[-1])
    return 2 * macs + int(input.numel()), macs


def _einsum(out, equation, *operands):
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    inputs = equation.replace(" ", "").split("->")[0].split(",")
    if len(operands) == 1:
        return int(operands[0].numel()), 0
    if len(operands) != 2 or "..." in equation or len(inputs) != 2:
        raise NotImplementedError(
            f"flops profiler: einsum '{equation}' with {len(operands)} operands is not "
            f"supported (two operands without '...' are)")
    sizes = {}
    for letters, tensor in zip(inputs, operands):
        for letter, size in zip(letters, tensor.shape):
            sizes[letter] = max(sizes.get(letter, 1), int(size))
    macs = _numel(sizes.values())  # one product for each combination of all indices
    return 2 * macs, macs


def _sdpa(out, query, key, value, *args, **kwargs):
    l_k, d_v = int(key.shape[-2]), int(value.shape[-1])
    macs = _numel(query.shape) * l_k + _numel(query.shape[:-1]) * l_k * d_v
    return 2 * macs, macs


def _normalization(out, input, *args, weight=None, **kwargs):
    return int(input.numel()) * (5 if weight is not None else 4), 0


def _layer_norm(out, input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return int(input.numel()) * (5 if weight is not None else 4), 0


def _batch_norm(out, input, running_mean, running_var, weight=None, bias=None, training=False,
                momentum=0.1, eps=1e-5):
    return int(input.numel()) * (5 if weight is not None else 4), 0


def _group_norm(out, input, num_groups, weight=None, bias=None, eps=1e-5):
    return int(input.numel()) * (5 if weight is not None else 4), 0


def _instance_norm(out, input, running_mean=None, running_var=None, weight=None, bias=None,
                   *args, **kwargs):
    return int(input.numel()) * (5 if weight is not None else 4), 0


def _rms_norm(out, input, normalized_shape, weight=None, eps=None):
    return int(input.numel()) * (4 if weight is not None else 3), 0


def _embedding(out, input, weight, *args, **kwargs):
    return 0, 0  # a table lookup: no arithmetic


def _check_interpolate(input, size=None, scale_factor=None, *args, **kwargs):
    assert size is not None or scale_factor is not None, \
        "interpolate/upsample needs either size or scale_factor"


def _interpolate(out, input, size=None, scale_factor=None, *args, **kwargs):
    return int(out.numel()), 0


_ACTIVATIONS = ("relu", "relu_", "prelu", "elu", "elu_", "leaky_relu", "leaky_relu_", "relu6",
                "silu", "gelu", "mish", "hardswish", "sigmoid", "tanh", "softplus", "selu",
                "celu")
_POOLS = ("avg_pool1d", "avg_pool2d", "avg_pool3d", "max_pool1d", "max_pool2d", "max_pool3d",
          "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
          "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d")


# Argument checks run before the op, so a bad call fails with the profiler's message.
PRECHECKS = {"conv1d": _check_conv, "conv2d": _check_conv, "conv3d": _check_conv,
              "conv_transpose1d": _check_conv_transpose,
              "conv_transpose2d": _check_conv_transpose,
              "conv_transpose3d": _check_conv_transpose,
              "interpolate": _check_interpolate, "upsample": _check_interpolate,
              "upsample_nearest": _check_interpolate, "upsample_bilinear": _check_interpolate}


def op_rules():
    """(owner, attribute, rule) for every op the profiler wraps (``torch_patches``); absent
    attributes are skipped so an older or newer torch loses only the ops it lacks."""
    functional = {
        "linear": _linear,
        "conv1d": _conv, "conv2d": _conv, "conv3d": _conv,
        "conv_transpose1d": _conv_transpose, "conv_transpose2d": _conv_transpose,
        "conv_transpose3d": _conv_transpose,
        "softmax": _elementwise, "log_softmax": _elementwise,
        "scaled_dot_product_attention": _sdpa,
        "batch_norm": _batch_norm, "layer_norm": _layer_norm, "group_norm": _group_norm,
        "instance_norm": _instance_norm, "rms_norm": _rms_norm,
        "embedding": _embedding,
        "interpolate": _interpolate, "upsample": _interpolate,
        "upsample_nearest": _interpolate, "upsample_bilinear": _interpolate,
    }
    functional.update({name: _elementwise for name in _ACTIVATIONS + _POOLS})
    rules = [(F, name, rule) for name, rule in functional.items()]
    tensor_ops = {"matmul": _matmul, "mm": _matmul, "bmm": _matmul, "addmm": _addmm,
                  "baddbmm": _baddbmm, "mul": _output_elementwise, "add": _output_elementwise}
    rules += [(torch, name, rule) for name, rule in tensor_ops.items()]
    rules += [(torch.Tensor, name, rule) for name, rule in tensor_ops.items()]
    rules.append((torch.Tensor, "__matmul__", _matmul))
    rules.append((torch, "einsum", _einsum))
    return [(owner, name, rule) for owner, name, rule in rules if hasattr(owner, name)]
