"""Debug access to partitioned training state (``deepspeed.utils.safe_get_full_fp32_param`` ...).

Under ZeRO each rank holds only a fragment of a parameter's fp32 master copy, gradient and
optimizer state. A plugin that partitions a parameter's state attaches a
``deepspeed.hooks.ParamStateAccess`` to it (attribute ``deepspeed.hooks.PARAM_STATE_ACCESS``);
these functions only dispatch to it, so the core needs no knowledge of the plugin.

A parameter without one is held whole by its module and its torch optimizer: the fp32 value
is the parameter itself, the gradient is ``param.grad``, and the optimizer state is not
reachable from the parameter, so the state getters return None and the state setters raise.

``full`` functions are collectives over the data-parallel group when the state is partitioned:
every rank must call them, or the job hangs. They return the parameter's full shape. ``local``
functions return this rank's fragment as a 1-D tensor (the whole flattened parameter when it
is not partitioned) and are not collectives. Phases: gradients are readable after
``backward`` and before ``step``; fp32 weights and optimizer states change at ``step``.
"""
import torch

from deepspeed.hooks import PARAM_STATE_ACCESS


def _access(param):
    return getattr(param, PARAM_STATE_ACCESS, None)


def _state_unreachable(param, key):
    return ValueError(f"optimizer state {key!r} of this parameter (shape {tuple(param.shape)}) "
                      f"is not reachable: it is not managed by a ZeRO optimizer, so its state "
                      f"lives in your torch optimizer; set it there")


# ---------------------------------------------------------------------- full (collective)
def safe_get_full_fp32_param(param):
    """The whole fp32 master copy of ``param``, in its full shape."""
    access = _access(param)
    if access is not None:
        return access.get_full_hp_param(param)
    return param.detach().float().clone()


def safe_get_full_grad(param):
    """The whole fp32 gradient: ``param.grad`` when it is set (as upstream), else the reduced
    gradient the partitioning plugin holds (after backward, before step); None without either."""
    if param.grad is not None:
        return param.grad
    access = _access(param)
    if access is not None:
        return access.get_full_hp_grad(param)
    return None


def safe_get_full_optimizer_state(param, optim_state_key):
    """The whole fp32 optimizer state ``optim_state_key`` (e.g. ``"exp_avg"``) of ``param``;
    None when no ZeRO optimizer manages it."""
    access = _access(param)
    if access is None:
        return None
    return access.get_full_hp_param(param, optim_state_key)


def safe_set_full_fp32_param(param, value):
    """Set the fp32 master (and the model's weights) of ``param`` from a full-shape ``value``."""
    access = _access(param)
    if access is not None:
        access.set_full_hp_param(value, param)
        return
    with torch.no_grad():
        param.data.copy_(torch.as_tensor(value).reshape(param.shape))


def safe_set_full_grad(param, value):
    """Replace the gradient the next step uses with the full-shape ``value``: the reduced
    gradient the partitioning plugin holds (after backward, before step; each rank keeps its
    fragment), else ``param.grad``. What ``safe_get_full_grad`` reads back."""
    access = _access(param)
    if access is not None:
        access.set_full_hp_grad(value, param)
        return
    _set_grad(param, torch.as_tensor(value).reshape(param.shape))


def safe_set_full_optimizer_state(param, value, optim_state_key):
    """Set the fp32 optimizer state ``optim_state_key`` of ``param`` from a full-shape value."""
    access = _access(param)
    if access is None:
        raise _state_unreachable(param, optim_state_key)
    access.set_full_hp_param(value, param, optim_state_key)


# ---------------------------------------------------------------------- local (this rank)
def safe_get_local_fp32_param(param):
    """This rank's fragment (1-D) of the fp32 master copy of ``param``."""
    access = _access(param)
    if access is not None:
        return access.get_local_hp_param(param)
    return param.detach().reshape(-1).float().clone()


def safe_get_local_grad(param):
    """This rank's fragment (1-D) of the fp32 gradient of ``param`` (None without one)."""
    access = _access(param)
    if access is not None:
        return access.get_local_hp_grad(param)
    return None if param.grad is None else param.grad.reshape(-1)


def safe_get_local_optimizer_state(param, optim_state_key):
    """This rank's fragment (1-D) of optimizer state ``optim_state_key`` of ``param``; None
    when no ZeRO optimizer manages it."""
    access = _access(param)
    if access is None:
        return None
    return access.get_local_hp_param(param, optim_state_key)


def safe_set_local_fp32_param(param, value):
    """Set this rank's fragment of the fp32 master of ``param`` (and its weights on this rank)."""
    access = _access(param)
    if access is not None:
        access.set_local_hp_param(value, param)
        return
    with torch.no_grad():
        param.data.view(-1).copy_(torch.as_tensor(value).reshape(-1))


def safe_set_local_grad(param, value):
    """Replace this rank's fragment (1-D) of the gradient the next step uses; without a
    partitioning plugin the fragment is the whole flattened ``param.grad``."""
    access = _access(param)
    if access is not None:
        access.set_local_hp_grad(value, param)
        return
    _set_grad(param, torch.as_tensor(value).reshape(param.shape))


def _set_grad(param, value):
    """``param.grad`` becomes ``value`` (copied into the existing gradient when there is one)."""
    with torch.no_grad():
        if param.grad is None:
            param.grad = value.to(param.device, param.dtype).clone()
        else:
            param.grad.copy_(value)


def safe_set_local_optimizer_state(param, value, optim_state_key):
    """Set this rank's fragment of optimizer state ``optim_state_key`` of ``param``."""
    access = _access(param)
    if access is None:
        raise _state_unreachable(param, optim_state_key)
    access.set_local_hp_param(value, param, optim_state_key)


__all__ = ["safe_get_full_fp32_param", "safe_get_full_grad", "safe_get_full_optimizer_state",
           "safe_set_full_fp32_param", "safe_set_full_grad", "safe_set_full_optimizer_state",
           "safe_get_local_fp32_param", "safe_get_local_grad", "safe_get_local_optimizer_state",
           "safe_set_local_fp32_param", "safe_set_local_grad", "safe_set_local_optimizer_state"]
