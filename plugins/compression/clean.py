"""``redundancy_clean``'s work: compressed layers -> plain, smaller torch layers.

Two passes. First every compression-aware layer is replaced by its torch base class holding the
weight it computes with (masks applied, quantization baked at the current bits). Then the
structure the masks removed goes: rows (row pruning) or output channels (channel pruning) leave
the layer and the matching input columns / channels / BatchNorm features leave its related
modules; pruned heads leave the attention output's input columns and the related Q/K/V rows,
and a parent attention module's ``num_attention_heads`` / ``all_head_size`` follow.
"""
import torch

from .basic_layer import CompressionState
from .matching import get_module, set_module


def clean_model(model):
    plans = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, CompressionState):
            continue
        plans.append(_structure_plan(name, module))
        set_module(model, name, _baked(module))
    for name, dim, keep, related in plans:
        _select(model, name, dim, keep)
        for related_name in related:
            _select(model, related_name, 1 - dim if dim in (0, 1) else dim, keep)
            if dim == 1:
                _fix_heads(model, related_name, keep.numel())
    return model


@torch.no_grad()
def _baked(layer):
    """The plain torch layer computing what ``layer`` computes now."""
    if layer.plan.get("weight_quantization", {}).get("in_forward") is False:
        weight, bias = layer.masked_weight_and_bias()  # the stored weight is already on the grid
    else:
        weight, bias = layer.effective_weight_and_bias()
    kind, has_bias = layer.kind, getattr(layer, "bias", None) is not None
    if kind == "linear":
        plain = torch.nn.Linear(layer.in_features, layer.out_features, bias=has_bias)
    elif kind == "conv2d":
        plain = torch.nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size,
                                stride=layer.stride, padding=layer.padding,
                                dilation=layer.dilation, groups=layer.groups, bias=has_bias,
                                padding_mode=layer.padding_mode)
    else:
        plain = torch.nn.Embedding(layer.num_embeddings, layer.embedding_dim,
                                   padding_idx=layer.padding_idx, max_norm=layer.max_norm,
                                   norm_type=layer.norm_type,
                                   scale_grad_by_freq=layer.scale_grad_by_freq,
                                   sparse=layer.sparse)
    plain = plain.to(device=layer.weight.device, dtype=layer.weight.dtype)
    plain.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=layer.weight.requires_grad)
    if has_bias:
        plain.bias = torch.nn.Parameter(bias.detach().clone(), requires_grad=layer.bias.requires_grad)
    plain.train(layer.training)
    return plain


def _kept(mask):
    return torch.nonzero(mask.detach().reshape(-1) > 0).reshape(-1)


def _structure_plan(name, layer):
    """(name, dim, kept indices, related names) of the structure ``layer`` drops, dim 0 for
    rows / output channels, 1 for input columns (heads); an empty plan for unstructured ones."""
    rows = layer.row_mask()
    if rows is not None:
        technique = "row_pruning" if "row_pruning" in layer.active else "channel_pruning"
        return name, 0, _kept(rows), layer.plan[technique]["related"]
    columns = layer.column_mask()
    if columns is not None:
        return name, 1, _kept(columns), layer.plan["head_pruning"]["related"]
    return name, None, None, []


@torch.no_grad()
def _select(model, name, dim, keep):
    """Keep only indices ``keep`` of dimension ``dim`` (0: outputs, 1: inputs) of a module."""
    if dim is None:
        return
    module = get_module(model, name)
    if isinstance(module, torch.nn.BatchNorm2d):
        for attr in ("weight", "bias"):
            if getattr(module, attr) is not None:
                setattr(module, attr, torch.nn.Parameter(getattr(module, attr)[keep].clone()))
        for attr in ("running_mean", "running_var"):
            if getattr(module, attr) is not None:
                setattr(module, attr, getattr(module, attr)[keep].clone())
        module.num_features = keep.numel()
        return
    module.weight = torch.nn.Parameter(module.weight.index_select(dim, keep).clone())
    if dim == 0 and module.bias is not None:
        module.bias = torch.nn.Parameter(module.bias[keep].clone())
    if isinstance(module, torch.nn.Linear):
        module.out_features, module.in_features = module.weight.shape
    elif isinstance(module, torch.nn.Conv2d):
        module.out_channels = module.weight.shape[0]
        module.in_channels = module.weight.shape[1] * module.groups


def _fix_heads(model, related_name, kept_features):
    """After Q/K/V lost rows, tell their attention module how many heads remain."""
    parent_name = related_name.rpartition(".")[0]
    parent = get_module(model, parent_name) if parent_name else model
    head_size = getattr(parent, "attention_head_size", None)
    if head_size and hasattr(parent, "num_attention_heads"):
        parent.num_attention_heads = kept_features // head_size
        if hasattr(parent, "all_head_size"):
            parent.all_head_size = kept_features
