"""Detecting inf/nan gradients (fp16 overflow), locally and over a process group.

``has_inf_or_nan`` is the local test; ``overflow_anywhere`` ORs it over a group with one
``all_reduce(MAX)`` of a single flag, so every rank skips the step or none does. ``CheckOverflow``
is upstream's class of the same job (``deepspeed.runtime.utils.CheckOverflow``), which code
written against upstream calls on its own parameters.
"""
import torch

from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator


def has_inf_or_nan(tensors):
    """Whether any of ``tensors`` (None entries skipped) holds an inf or a nan."""
    found = [t for t in tensors if t is not None and t.numel()]
    if not found:
        return False
    return bool(torch.stack([(~torch.isfinite(t)).any() for t in found]).any())


def overflow_anywhere(local, group=None, device=None):
    """``local`` ORed over ``group`` (None: the world) when a process group is up; the flag
    travels on ``device`` (default: the accelerator's current device, as NCCL requires)."""
    if device is None:
        device = get_accelerator().current_device_name()
    flag = torch.tensor([1.0 if local else 0.0], device=device)
    if dist.is_initialized():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


class CheckOverflow:
    """Checks parameters' gradients for inf/nan across the ranks that hold different parts of
    them: the model-parallel group of ``mpu`` when given, every rank with
    ``zero_reduce_scatter`` (each holds a partition), else this rank alone (data-parallel
    replicas hold the same reduced gradients). ``param_groups`` is a list of lists of
    parameters (or of optimizer param-group dicts); ``deepspeed`` (an engine) is accepted for
    upstream's signature and not needed."""

    def __init__(self, param_groups=None, mpu=None, zero_reduce_scatter=False, deepspeed=None):
        self.mpu = mpu
        self.zero_reduce_scatter = zero_reduce_scatter
        self.deepspeed = deepspeed
        self.params = _flatten(param_groups) if param_groups is not None else []

    def _group(self):
        if self.zero_reduce_scatter:
            return None
        return self.mpu.get_model_parallel_group() if self.mpu is not None else False

    def check(self, param_groups=None):
        """Whether any gradient of ``param_groups`` (default: those given at construction)
        holds inf/nan on any rank of the group."""
        params = _flatten(param_groups) if param_groups is not None else self.params
        return self.has_overflow(params)

    def check_using_norm(self, norm_group, reduce_overflow=True):
        """Overflow judged from already computed gradient norms: any norm that is inf, nan or
        upstream's -1 marker; ORed over the group when ``reduce_overflow``."""
        local = any(float(n) == -1 or not torch.isfinite(torch.as_tensor(float(n)))
                    for n in norm_group)
        group = self._group()
        if not reduce_overflow or group is False:
            return local
        return overflow_anywhere(local, group)

    def has_overflow_serial(self, params):
        """This rank's gradients only (no communication)."""
        return has_inf_or_nan([p.grad for p in params])

    def has_overflow(self, params, has_moe_params=None):
        """This rank's verdict ORed over the group (see the class docstring); over every rank
        when ``has_moe_params`` says ``params`` include ones that differ between ranks outside
        that group (upstream's flag for expert weights)."""
        local = self.has_overflow_serial(params)
        group = None if has_moe_params else self._group()
        return local if group is False else overflow_anywhere(local, group)

    @staticmethod
    def _has_inf_or_nan(x, i=None):
        return has_inf_or_nan([x])


def _flatten(param_groups):
    params = []
    for group in param_groups:
        if isinstance(group, dict):
            group = group["params"]
        if torch.is_tensor(group):
            group = [group]
        params.extend(group)
    return params


__all__ = ["CheckOverflow", "has_inf_or_nan", "overflow_anywhere"]
