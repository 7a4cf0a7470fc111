"""``deepspeed.utils.safe_get_*`` for a ZeRO-3 parameter no ZeRO optimizer manages (frozen, or
built under ``zero.Init`` before any engine): its only state is its weight shard.

The ``deepspeed.hooks.ParamStateAccess`` the partitioner attaches to every parameter it
shards; the ZeRO optimizer replaces it with itself for the parameters it steps (their fp32
master, gradient and optimizer state live in its partitions). Without an optimizer the "fp32
value" is the 16-bit weight widened, there is no reduced gradient, and there is no optimizer
state to reach, so those accessors say so.
"""
import torch

from deepspeed.zero.param_status import ZeroParamStatus


def _available(param):
    return param.ds_status is ZeroParamStatus.AVAILABLE


def _no_state(param, key):
    return ValueError(f"optimizer state {key!r} of this parameter (shape {tuple(param.ds_shape)})"
                      f" is not reachable: no ZeRO optimizer manages it (is it frozen?), so it "
                      f"has no optimizer state here")


def _no_grad(param):
    return ValueError(f"the gradient of this parameter (shape {tuple(param.ds_shape)}) cannot be "
                      f"set: no ZeRO optimizer manages it (is it frozen?), so no step uses one")


class ShardOnlyAccess:
    """Reads and writes a ZeRO-3 parameter's weight shard (one instance serves them all)."""

    # ------------------------------------------------------------------ full (collective)
    def get_full_hp_param(self, param, optim_state_key=None):
        if optim_state_key is not None:
            return None
        if _available(param):
            return param.detach().float().clone()
        param.all_gather()
        try:
            return param.detach().float().clone()
        finally:
            param.partition()

    def get_full_hp_grad(self, param):
        return param.grad

    def set_full_hp_param(self, value, param, optim_state_key=None):
        if optim_state_key is not None:
            raise _no_state(param, optim_state_key)
        value = torch.as_tensor(value)
        available = _available(param)
        with torch.no_grad():
            if not available:
                param.all_gather()
            param.data.copy_(value.reshape(param.ds_shape))
            param.ds_partitioner.write_shard_from_full(param)
            if not available:
                param.partition()

    def set_full_hp_grad(self, value, param):
        raise _no_grad(param)

    # ------------------------------------------------------------------ local (this rank)
    def get_local_hp_param(self, param, optim_state_key=None):
        if optim_state_key is not None:
            return None
        return _with_fragment(param, lambda fragment: fragment.float().clone())

    def get_local_hp_grad(self, param):
        return None if param.grad is None else param.grad.reshape(-1)

    def set_local_hp_grad(self, value, param):
        raise _no_grad(param)

    def set_local_hp_param(self, value, param, optim_state_key=None):
        if optim_state_key is not None:
            raise _no_state(param, optim_state_key)
        value = torch.as_tensor(value).reshape(-1)
        with torch.no_grad():
            _with_fragment(param, lambda fragment: fragment.copy_(
                value.narrow(0, 0, fragment.numel())))


SHARD_ONLY_ACCESS = ShardOnlyAccess()


def _with_fragment(param, use):
    """``use(fragment)`` on this rank's elements of the shard (padding cut off), read back from
    NVMe around the call when the shard is offloaded there."""
    partitioner = param.ds_partitioner
    shard = partitioner.fetch(param)
    try:
        start = partitioner.rank * shard.numel()
        length = max(0, min(shard.numel(), param.ds_numel - start))
        return use(shard.reshape(-1).narrow(0, 0, length))
    finally:
        partitioner.settle(param)
