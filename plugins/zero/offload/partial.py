"""Partial optimizer offload (``zero_optimization.offload_optimizer.ratio`` < 1, ZeRO-3).

``ratio`` of each rank's optimizer partition (its fp32 master elements, and with them their
optimizer state) goes to the offload device and is stepped by the configured (CPU) optimizer;
the rest stays where the partition was built (the accelerator) and is stepped there by a
*device twin*: an optimizer of the same kind and hyperparameters over those sub-groups. Both
step the same update rule, so training equals full offload; the point is memory and time: the
resident part needs no host round trip, the offloaded part no accelerator memory.

The cut is made per optimizer param group, in partition order: the first ``round(ratio * n)``
elements of a group's partition are offloaded, the rest resident, each side then split into
``sub_group_size`` sub-groups as usual. With NVMe (``device: nvme``) the offloaded sub-groups
are the ones swapped to disk; the resident ones stay in memory.
"""
from collections import OrderedDict, defaultdict

import torch

# DeepSpeed's CPU optimizers step host tensors only: on an accelerator the twin is the fused
# optimizer with the same update rule, built from the CPU optimizer's hyperparameters
_DEVICE_COUNTERPARTS = {
    "DeepSpeedCPUAdam": lambda opt, groups: _fused_adam(opt, groups),
    "DeepSpeedCPUAdagrad": lambda opt, groups: torch.optim.Adagrad(groups, **_picked(
        opt.defaults, "lr", "eps", "weight_decay")),
    "DeepSpeedCPULion": lambda opt, groups: _fused_lion(opt, groups),
}
# per-group entries the twin keeps for itself when it copies the hyperparameters
_OWN_GROUP_KEYS = ("params", "step")


def _picked(source, *names):
    return {name: source[name] for name in names if name in source}


def _fused_adam(optimizer, groups):
    from deepspeed.ops.adam import FusedAdam

    return FusedAdam(groups, adam_w_mode=bool(getattr(optimizer, "adamw_mode", True)),
                     **_picked(optimizer.defaults, "lr", "bias_correction", "betas", "eps",
                               "weight_decay"))


def _fused_lion(optimizer, groups):
    from deepspeed.ops.lion import FusedLion

    return FusedLion(groups, **_picked(optimizer.defaults, "lr", "betas", "weight_decay"))


def offloaded_numel(numel: int, ratio: float) -> int:
    """How many of a group partition's ``numel`` elements go to the offload device."""
    return min(numel, max(0, round(ratio * numel)))


def split_partition(flat: torch.Tensor, ratio: float, sub_group_size: int):
    """``[(piece, offloaded)]``: ``flat`` (one group's partition) cut at the offload boundary,
    each side into sub-groups of at most ``sub_group_size`` elements."""
    if flat.numel() == 0:  # a rank owning nothing of this group still has one (empty) piece
        return [(flat, ratio > 0)]
    cut = offloaded_numel(flat.numel(), ratio)
    return [(piece, offloaded) for side, offloaded in ((flat[:cut], True), (flat[cut:], False))
            if side.numel() for piece in side.split(sub_group_size)]


def device_twin(optimizer: torch.optim.Optimizer, device: torch.device, param_groups):
    """An optimizer stepping ``param_groups`` (the resident sub-groups, one group per group of
    ``optimizer``) by ``optimizer``'s update rule and hyperparameters, on ``device``."""
    groups = [dict(group) for group in param_groups]
    build = _DEVICE_COUNTERPARTS.get(type(optimizer).__name__)
    if device.type != "cpu" and build is not None:
        twin = build(optimizer, [{"params": g["params"]} for g in groups])
        twin.param_groups = groups  # the exact per-group hyperparameters, as given
        return twin
    # any other optimizer (torch's run on every device; a CPU optimizer on a CPU-only build):
    # a copy of the object keeps every setting (adamw_mode, its native kernel, ...), with its
    # own parameters, state and hooks (not copy.copy: torch's __getstate__ keeps only
    # defaults, state and param groups)
    twin = object.__new__(type(optimizer))
    twin.__dict__.update(vars(optimizer))
    twin.state = defaultdict(dict)
    twin.param_groups = groups
    for name, value in list(vars(twin).items()):
        if name.startswith("_optimizer_") and isinstance(value, dict):
            setattr(twin, name, OrderedDict())
    return twin


def sync_hyperparameters(source: torch.optim.Optimizer, twin: torch.optim.Optimizer) -> None:
    """Copy every per-group hyperparameter (a scheduled lr, ...) from ``source`` to ``twin``."""
    for mine, theirs in zip(twin.param_groups, source.param_groups):
        mine.update({k: v for k, v in theirs.items() if k not in _OWN_GROUP_KEYS})
