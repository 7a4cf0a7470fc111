"""The one seam between ZeRO-3's collectives and the algorithms that change them: ZeRO++
(quantized weights, hierarchical partitions, quantized gradients, MixZ++) and MiCS (shard
groups). Plain ZeRO-3 leaves it unset and runs exactly as before.

A ``Partitioner`` whose ``comm`` is set asks ``comm.route(partitioner, param)`` which *route*
gathers ``param`` (None: the plain all-gather over the partitioner's group). Parameters sharing
one route, dtype and device are gathered by one collective. A route has

    world_size      pieces in the gathered output (the size of the group it gathers over)
    start(partitioner, params, dtype, device, async_op) -> (keepalive, output, work, sizes)
                    like ``partition_parameters._all_gather_shards``: ``output`` is rank-major,
                    (world_size, sum(sizes)), valid once ``work.wait()`` returned (or at once
                    when ``work`` is None); ``keepalive`` must live until then
    gathered(params)  the parameters are whole now (hpZ keeps its secondary piece here)

The ``GradientReducer`` calls its ``reduce_scatter(output, input, group, async_op)`` attribute
where it used ``deepspeed.comm.reduce_scatter_tensor``; a ``ShardComm`` installs its own
(qgZ: quantized hierarchical all-to-all; MiCS: shard-group reduce-scatter + replica all-reduce).
"""
import torch

from deepspeed import comm as dist
from deepspeed.utils.transient_buffers import transient_empty


def start_rank_major_gather(shards, world_size, dtype, device, launch):
    """Copy ``shards`` back to back into a send buffer and ``launch(output, send)`` the
    collective that fills the rank-major ``output`` (world_size blocks of that size). Returns
    (send buffer, output, work, shard sizes); the send buffer must live until the work is done.
    A single shard already in place is sent as it is (most ZeRO-3 gathers are one weight: a
    Linear's bias persists), as the per-parameter path did: no copy, and no short-lived
    shard-sized allocation between the long-lived full buffers (-3 MiB peak RSS on the
    larger bench GPT). With one rank the output *is* the send buffer: always a copy, never a
    shard itself."""
    sizes = [s.numel() for s in shards]
    if world_size > 1 and len(shards) == 1 and _sendable(shards[0], dtype, device):
        send = shards[0].view(-1)
    else:
        send = transient_empty(sum(sizes), dtype, device)
        torch.cat([s.to(device=device, dtype=dtype, non_blocking=True) for s in shards], out=send)
    if world_size == 1:
        return send, send, None, sizes
    output = transient_empty(send.numel() * world_size, dtype, device)
    return send, output, launch(output, send), sizes


def _sendable(shard, dtype, device):
    return shard.dtype == dtype and shard.device == torch.device(device) and shard.is_contiguous()


def plain_reduce_scatter(output, input, group, async_op):
    """The reducer's default: one reduce-scatter over ``group`` (its input is scratch)."""
    return dist.reduce_scatter_tensor(output, input, group=group, async_op=async_op,
                                      input_is_scratch=True)


def plain_all_gather(output, send, group, async_op):
    return dist.all_gather_into_tensor(output, send, group=group, async_op=async_op)


class Route:
    """Gather each parameter's ``shard(param)`` (default: its ZeRO-3 shard) over ``group`` with
    ``transport`` (default: a plain ``all_gather_into_tensor``; qwZ passes a quantized one)."""

    def __init__(self, group, transport=None, on_gathered=None, shard=None):
        self.group = group
        self.world_size = dist.get_world_size(group=group)
        self.transport = transport or plain_all_gather
        self.on_gathered = on_gathered
        self._shard = shard

    def shard(self, partitioner, param):
        return partitioner.fetch(param) if self._shard is None else self._shard(param)

    def start(self, partitioner, params, dtype, device, async_op):
        return start_rank_major_gather(
            [self.shard(partitioner, p) for p in params], self.world_size, dtype, device,
            lambda output, send: self.transport(output, send, self.group, async_op))

    def gathered(self, params):
        if self.on_gathered is not None:
            self.on_gathered(params)


class ShardComm:
    """Plain ZeRO-3 (every hook a no-op); subclasses override what they change."""

    reduce_scatter = staticmethod(plain_reduce_scatter)

    def route(self, partitioner, param):
        return None

    def load_full(self, partitioner, param, full):
        """Set ``param``'s shard from the whole tensor ``full`` when the shard is stored in a
        form of this comm's own (return True); False: the partitioner does it as usual."""
        return False

    def after_step(self):
        """The optimizer stepped: shards changed (hpZ: secondary copies are stale now)."""

    def install(self, partitioner):
        partitioner.comm = self
        return self
