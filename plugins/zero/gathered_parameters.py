"""``deepspeed.zero.GatheredParameters``: hold ZeRO-3 parameters whole for a block of code.

Used to read or initialise weights outside a forward (``with GatheredParameters(w,
modifier_rank=0): if rank == 0: w.copy_(...)``). On exit, when ``modifier_rank`` is set, that
rank's full values are broadcast and every rank keeps its shard of them; the ZeRO optimizer's
fp32 master copy of the parameter is refreshed too, or the next step would overwrite the edit
with the old master. Without ``modifier_rank`` edits are discarded (a parameter that was already
whole on entry, a resident persistent one, is restored from its shard). Every parameter the
context gathered is partitioned again on exit, persistent ones included.

Every rank must enter the context with the same parameters: they are gathered and broadcast
in ``ds_id`` order so the collectives pair up.
"""
import torch

from deepspeed.hooks import PARAM_STATE_ACCESS
from deepspeed.zero.partition_parameters import (ZeroParamStatus, gather_params, is_zero_param,
                                                 publish_full, release_params)
from deepspeed.zero.stage3 import register_external_parameter


def _as_list(params):
    if params is None:
        return []
    if torch.is_tensor(params):
        return [params]
    return list(params)


class GatheredParameters:
    """Gather ``params`` (one parameter or an iterable; anything that is not a ZeRO-3
    parameter is ignored, so this is a no-op under stages 0-2) on enter, release on exit.

    ``fwd_module``: also register the parameters as external parameters of that module. The
    registration is kept after exit: the typical use is inside ``fwd_module.forward``, and the
    module's post-forward hook and backward (which run after the context closed) must gather
    the parameter again. ``enabled=False`` makes the context a no-op."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        self.enabled = enabled
        self.modifier_rank = modifier_rank
        unique = {}
        for param in _as_list(params) if enabled else []:
            if is_zero_param(param):
                unique[param.ds_id] = param
        self.params = [unique[k] for k in sorted(unique)]
        if not self.params:
            self.enabled = False
            return
        if modifier_rank is not None:
            world = self.params[0].ds_partitioner.world_size
            if not isinstance(modifier_rank, int) or not 0 <= modifier_rank < world:
                raise ValueError(f"GatheredParameters: modifier_rank={modifier_rank!r} is not a "
                                 f"rank of the parameters' data-parallel group (0..{world - 1}) "
                                 f"or None")
        if fwd_module is not None:
            for param in self.params:
                register_external_parameter(fwd_module, param)
        self._gathered = []

    def __enter__(self):
        if not self.enabled:
            return None
        # only what we gather is released on exit: a parameter already whole (persistent,
        # or in use by an enclosing module's forward) stays whole
        self._gathered = [p for p in self.params if p.ds_status is not ZeroParamStatus.AVAILABLE]
        gather_params(self._gathered)
        return self.params[0] if len(self.params) == 1 else self.params

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        with torch.no_grad():
            if self.modifier_rank is not None:
                self._publish()
            else:
                self._restore_kept()
        # every parameter gathered here is partitioned again, a persistent one too: it becomes
        # resident only when the engine gathers it for a forward
        release_params(self._gathered, force=True)
        self._gathered = []
        return False

    def _publish(self):
        """Broadcast the modifier's full values; every rank keeps its shard of them."""
        publish_full(self.params, self.modifier_rank)
        for param in self.params:
            owner = getattr(param, PARAM_STATE_ACCESS, None)
            if hasattr(owner, "refresh_fp32_param"):  # the ZeRO optimizer stepping it
                owner.refresh_fp32_param(param)

    def _restore_kept(self):
        """Edits are discarded: the released parameters lose them by being released; those
        that stay whole are rebuilt from their (unchanged) shards."""
        gathered = {id(p) for p in self._gathered}
        kept = [p for p in self.params if id(p) not in gathered]
        release_params(kept, force=True)
        gather_params(kept)
