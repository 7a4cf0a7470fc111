"""Telling expert parameters from dense ones, for optimizers and gradient code.

An expert parameter carries ``allreduce = False`` and ``group_name = "ep_size_{n}"`` (set by
``deepspeed.moe.experts.Experts``). Optimizer param groups must not mix the two kinds (their
gradients are reduced over different groups and, under ZeRO, partitioned over different
ranks), hence ``split_params_into_different_moe_groups_for_optimizer``.
"""
from typing import Dict, List, Tuple

import torch
from torch import nn

# upstream's default bound on the elements of one expert param group
DEFAULT_MAX_GROUP_SIZE = 178956971


def is_moe_param(param: torch.Tensor) -> bool:
    return hasattr(param, "allreduce") and not param.allreduce


def has_moe_layers(model: nn.Module) -> Tuple[bool, List[int]]:
    """``(any MoE layer?, num_experts of each)`` in module order."""
    from deepspeed.moe.layer import MoE

    counts = [m.num_experts for m in model.modules() if isinstance(m, MoE)]
    return bool(counts), counts


def split_params_into_shared_and_expert_params(
        params: List[nn.Parameter]) -> Tuple[List[nn.Parameter], List[nn.Parameter]]:
    shared, expert = [], []
    for param in params:
        (expert if is_moe_param(param) else shared).append(param)
    return shared, expert


def split_params_grads_into_shared_and_expert_params(
        group: List[nn.Parameter]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """The gradients (of parameters that have one) of ``group``: ``(shared, expert)``."""
    shared, expert = [], []
    for param in group:
        if param.grad is not None:
            (expert if is_moe_param(param) else shared).append(param.grad.to(param.dtype))
    return shared, expert


def _as_group_list(param_groups):
    if isinstance(param_groups, dict):
        return [param_groups]
    if isinstance(param_groups, (list, tuple)):
        return list(param_groups)
    raise ValueError(f"Unknown param group type of {type(param_groups)}: pass a dict or a "
                     f"list/tuple of dicts")


def _chunks(params, max_group_size):
    """``params`` in order, cut so that no chunk holds more than ``max_group_size`` elements
    (a single larger parameter gets a chunk of its own)."""
    chunks, current, size = [], [], 0
    for param in params:
        if current and max_group_size is not None and size + param.numel() > max_group_size:
            chunks.append(current)
            current, size = [], 0
        current.append(param)
        size += param.numel()
    if current:
        chunks.append(current)
    return chunks


def split_params_into_different_moe_groups_for_optimizer(
        param_groups, max_group_size=DEFAULT_MAX_GROUP_SIZE) -> List[Dict]:
    """Move the expert parameters of each param group into groups of their own, one per
    expert group name (``ep_size_{n}``) and original group, marked ``'moe': True`` with the
    expert group name as ``'name'`` and the original group's other settings (lr, weight
    decay, ...). The original groups keep their dense parameters. Expert groups are cut to at
    most ``max_group_size`` elements each (None: never cut). Returns the list of all groups."""
    groups_in = _as_group_list(param_groups)
    for index, group in enumerate(groups_in):
        if not isinstance(group, dict) or "params" not in group:
            raise ValueError(f"param group {index} must be a dict with a 'params' entry, got "
                             f"{group!r}")
        group["params"] = list(group["params"])
    names = []
    for group in groups_in:
        for param in group["params"]:
            if is_moe_param(param) and param.group_name not in names:
                names.append(param.group_name)
    expert_groups = []
    for group in groups_in:
        by_name = {name: [] for name in names}
        dense = []
        for param in group["params"]:
            (by_name[param.group_name] if is_moe_param(param) else dense).append(param)
        group["params"] = dense
        settings = {key: value for key, value in group.items() if key not in ("params", "name")}
        for name, params in by_name.items():
            for chunk in (_chunks(params, max_group_size) if params else []):
                expert_groups.append({**settings, "name": name, "moe": True, "params": chunk})
    return groups_in + expert_groups
