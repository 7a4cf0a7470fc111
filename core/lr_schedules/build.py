"""Building the schedule a config names: ``"scheduler": {"type": ..., "params": {...}}``.

The name is matched exactly (case-sensitive), DeepSpeed's own schedules first and then any
scheduler class in ``torch.optim.lr_scheduler``, as upstream does; `params` go to the
constructor as keyword arguments after being checked against its signature, so a typo in a
key is reported with the key path and the closest valid key instead of a bare TypeError.
"""
import inspect
from collections.abc import Mapping

import torch

from deepspeed.config.call_params import check_call_params
from deepspeed.config.errors import DeepSpeedConfigError, closest_key
from deepspeed.lr_schedules._base import resolve_optimizer
from deepspeed.lr_schedules.constants import VALID_LR_SCHEDULES
from deepspeed.lr_schedules.one_cycle import OneCycle
from deepspeed.lr_schedules.range_test import LRRangeTest
from deepspeed.lr_schedules.warmup import WarmupCosineLR, WarmupDecayLR, WarmupLR

DEEPSPEED_LR_SCHEDULES = {cls.__name__: cls for cls in
                          (LRRangeTest, OneCycle, WarmupLR, WarmupDecayLR, WarmupCosineLR)}
assert list(DEEPSPEED_LR_SCHEDULES) == VALID_LR_SCHEDULES

_TORCH_BASES = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def _torch_schedules():
    module = torch.optim.lr_scheduler
    found = {}
    for attr in dir(module):
        obj = getattr(module, attr)
        if (inspect.isclass(obj) and issubclass(obj, _TORCH_BASES) and not attr.startswith("_")
                and obj is not torch.optim.lr_scheduler.LRScheduler):
            found[attr] = obj
    return found


def get_lr_scheduler_class(name):
    """The class a config `scheduler.type` names; AssertionError (upstream's type) otherwise."""
    if isinstance(name, str):
        if name in DEEPSPEED_LR_SCHEDULES:
            return DEEPSPEED_LR_SCHEDULES[name]
        torch_schedules = _torch_schedules()
        if name in torch_schedules:
            return torch_schedules[name]
    else:
        torch_schedules = _torch_schedules()
    guess = closest_key(str(name), VALID_LR_SCHEDULES + sorted(torch_schedules))
    hint = f" Did you mean {guess!r}?" if guess else ""
    raise AssertionError(
        f"DeepSpeed does not recognize LR scheduler {name!r}.{hint} scheduler.type must be one "
        f"of {VALID_LR_SCHEDULES} or a scheduler class of torch.optim.lr_scheduler "
        f"({', '.join(sorted(torch_schedules))}); names are case-sensitive.")


def _check_params(cls, name, params):
    """Every key is a constructor argument holding a value of the right kind, every required
    argument is given (see ``deepspeed.config.call_params``)."""
    problems = check_call_params(cls, params, ("scheduler", "params"), owner=name, require=True)
    if problems:
        raise DeepSpeedConfigError(problems)


def build_lr_scheduler(name, params, optimizer):
    """The schedule for config ``scheduler.type = name`` with ``scheduler.params = params``,
    driving `optimizer` (a torch optimizer, or a wrapper exposing one as ``.optimizer``)."""
    cls = get_lr_scheduler_class(name)
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise DeepSpeedConfigError(f"scheduler.params must be an object (dict), got "
                                   f"{type(params).__name__} {params!r}")
    _check_params(cls, name, params)
    optimizer = resolve_optimizer(optimizer)
    if cls not in DEEPSPEED_LR_SCHEDULES.values():
        return cls(optimizer, **params)
    try:
        return cls(optimizer, **params)
    except ValueError as err:
        if isinstance(err, DeepSpeedConfigError):
            raise
        raise DeepSpeedConfigError(f"scheduler.params ({name}): {err}") from err
