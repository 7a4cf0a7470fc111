"""Debug access to partitioned training state (``deepspeed.utils.safe_get_full_fp32_param`` ...).

Under ZeRO each rank holds only a fragment of a parameter's fp32 master copy, gradient and
optimizer state. A partitioning optimizer marks the parameters it manages with
``param._ds_optimizer`` and answers ``get_full_hp_param / get_local_hp_param /
get_full_hp_grad / get_local_hp_grad / set_full_hp_param / set_local_hp_param``; these
functions only dispatch to it, so the core needs no knowledge of the plugin.

Without such an optimizer there is nothing partitioned to assemble: the fp32 value is the
parameter itself (gathered first if it is a ZeRO-3 parameter, e.g. a frozen one), the
gradient is ``param.grad``, and the optimizer state is not reachable from the parameter, so the
state getters return None and the state setters raise.

``full`` functions are collectives over the data-parallel group when ZeRO is active: every rank
must call them, or the job hangs. They return the parameter's full shape (``ds_shape`` under
ZeRO-3). ``local`` functions return this rank's fragment as a 1-D tensor (the whole flattened
parameter without ZeRO) and are not collectives. Phases: gradients are readable after
``backward`` and before ``step``; fp32 weights and optimizer states change at ``step``.
"""
import torch


def _optimizer(param):
    return getattr(param, "_ds_optimizer", None)


def _is_zero3(param):
    return hasattr(param, "ds_tensor")


def _whole_copy(param):
    """An fp32 copy of the whole parameter (a collective for an unavailable ZeRO-3 one)."""
    if _is_zero3(param) and param.ds_status.name != "AVAILABLE":
        param.all_gather()
        try:
            return param.detach().float().clone()
        finally:
            param.partition()
    return param.detach().float().clone()


def _with_zero3_fragment(param, use):
    """``use(fragment)`` on this rank's elements of a ZeRO-3 parameter's shard (padding cut
    off), read back from NVMe around the call when the shard is offloaded there."""
    partitioner = param.ds_partitioner
    shard = partitioner.fetch(param) if hasattr(partitioner, "fetch") else param.ds_tensor
    try:
        start = partitioner.rank * shard.numel()
        length = max(0, min(shard.numel(), param.ds_numel - start))
        return use(shard.reshape(-1).narrow(0, 0, length))
    finally:
        if hasattr(partitioner, "settle"):
            partitioner.settle(param)


def _state_unreachable(param, key):
    return ValueError(f"optimizer state {key!r} of this parameter (shape "
                      f"{tuple(getattr(param, 'ds_shape', param.shape))}) is not reachable: it is "
                      f"not managed by a ZeRO optimizer, so its state lives in your torch "
                      f"optimizer; set it there")


# ---------------------------------------------------------------------- full (collective)
def safe_get_full_fp32_param(param):
    """The whole fp32 master copy of ``param``, in its full shape."""
    optimizer = _optimizer(param)
    if optimizer is not None:
        return optimizer.get_full_hp_param(param)
    return _whole_copy(param)


def safe_get_full_grad(param):
    """The whole fp32 gradient: ``param.grad`` when it is set (as upstream), else the reduced
    gradient the ZeRO optimizer holds (after backward, before step); None without either."""
    if param.grad is not None:
        return param.grad
    optimizer = _optimizer(param)
    if optimizer is not None:
        return optimizer.get_full_hp_grad(param)
    return None


def safe_get_full_optimizer_state(param, optim_state_key):
    """The whole fp32 optimizer state ``optim_state_key`` (e.g. ``"exp_avg"``) of ``param``;
    None when no ZeRO optimizer manages it."""
    optimizer = _optimizer(param)
    if optimizer is None:
        return None
    return optimizer.get_full_hp_param(param, optim_state_key)


def safe_set_full_fp32_param(param, value):
    """Set the fp32 master (and the model's weights) of ``param`` from a full-shape ``value``."""
    optimizer = _optimizer(param)
    if optimizer is not None:
        optimizer.set_full_hp_param(value, param)
        return
    value = torch.as_tensor(value)
    with torch.no_grad():
        if not _is_zero3(param):
            param.data.copy_(value.reshape(param.shape))
            return
        available = param.ds_status.name == "AVAILABLE"
        if not available:
            param.all_gather()
        param.data.copy_(value.reshape(param.ds_shape))
        param.ds_partitioner.write_shard_from_full(param)
        if not available:
            param.partition()


def safe_set_full_optimizer_state(param, value, optim_state_key):
    """Set the fp32 optimizer state ``optim_state_key`` of ``param`` from a full-shape value."""
    optimizer = _optimizer(param)
    if optimizer is None:
        raise _state_unreachable(param, optim_state_key)
    optimizer.set_full_hp_param(value, param, optim_state_key)


# ---------------------------------------------------------------------- local (this rank)
def safe_get_local_fp32_param(param):
    """This rank's fragment (1-D) of the fp32 master copy of ``param``."""
    optimizer = _optimizer(param)
    if optimizer is not None:
        return optimizer.get_local_hp_param(param)
    if _is_zero3(param):
        return _with_zero3_fragment(param, lambda fragment: fragment.float().clone())
    return param.detach().reshape(-1).float().clone()


def safe_get_local_grad(param):
    """This rank's fragment (1-D) of the fp32 gradient of ``param`` (None without one)."""
    optimizer = _optimizer(param)
    if optimizer is not None:
        return optimizer.get_local_hp_grad(param)
    return None if param.grad is None else param.grad.reshape(-1)


def safe_get_local_optimizer_state(param, optim_state_key):
    """This rank's fragment (1-D) of optimizer state ``optim_state_key`` of ``param``; None
    when no ZeRO optimizer manages it."""
    optimizer = _optimizer(param)
    if optimizer is None:
        return None
    return optimizer.get_local_hp_param(param, optim_state_key)


def safe_set_local_fp32_param(param, value):
    """Set this rank's fragment of the fp32 master of ``param`` (and its weights on this rank)."""
    optimizer = _optimizer(param)
    if optimizer is not None:
        optimizer.set_local_hp_param(value, param)
        return
    value = torch.as_tensor(value).reshape(-1)
    with torch.no_grad():
        if _is_zero3(param):
            _with_zero3_fragment(param, lambda fragment: fragment.copy_(
                value.narrow(0, 0, fragment.numel())))
        else:
            param.data.view(-1).copy_(value)


def safe_set_local_optimizer_state(param, value, optim_state_key):
    """Set this rank's fragment of optimizer state ``optim_state_key`` of ``param``."""
    optimizer = _optimizer(param)
    if optimizer is None:
        raise _state_unreachable(param, optim_state_key)
    optimizer.set_local_hp_param(value, param, optim_state_key)


__all__ = ["safe_get_full_fp32_param", "safe_get_full_grad", "safe_get_full_optimizer_state",
           "safe_set_full_fp32_param", "safe_set_full_optimizer_state",
           "safe_get_local_fp32_param", "safe_get_local_grad", "safe_get_local_optimizer_state",
           "safe_set_local_fp32_param", "safe_set_local_optimizer_state"]
