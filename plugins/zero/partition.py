"""Where every element of every trainable parameter lives under ZeRO stages 1 and 2.

Parameters of one optimizer param group are packed, in reverse registration order (the order
backward usually produces their gradients), into *buckets* of at most ``reduce_bucket_size``
elements. Each bucket is one flat buffer that the parameters become views of, padded to a
multiple of the data-parallel world size ``N`` and cut into ``N`` equal *pieces*: rank ``r``
owns piece ``r`` of every bucket. A rank's partition of the group is the concatenation of its
pieces, so

- reducing a bucket's gradients is one ``reduce_scatter`` whose output is exactly the receiving
  rank's piece (no all-reduce, no per-parameter reduce to an owner), and it can start as soon as
  the bucket's last gradient is ready, overlapping the rest of backward;
- publishing updated weights is one ``all_gather`` per bucket straight into the buffer the
  parameters view.

Each rank moves ``padded * (N - 1) / N`` elements per bucket and direction, the minimum. The
layout depends only on the parameter list, ``N`` and the bucket size, so every rank computes
the same one, and ``describe``/``partition_ranges`` let a checkpoint written under one layout be
re-cut for another world size.
"""
from dataclasses import dataclass, field
from typing import List

import torch

from deepspeed.zero.checkpoint_layout import (assemble, partition_numel,  # noqa: F401
                                              partition_ranges, split)


@dataclass
class Bucket:
    """Consecutive parameters of one group sharing one flat buffer."""

    group: int
    params: List[torch.nn.Parameter]
    offsets: List[int]  # element offset of each parameter inside the buffer
    numel: int  # elements used by parameters
    padded: int  # buffer length, a multiple of the world size
    piece: int  # padded // world size: elements each rank owns
    partition_offset: int  # where this bucket's piece starts inside a rank's group partition
    buffer: torch.Tensor = field(repr=False, default=None)
    _offset_of: dict = field(repr=False, default=None)  # id(param) -> offset, built on first use

    def piece_of(self, rank):
        return self.buffer.narrow(0, rank * self.piece, self.piece)

    def place_grad(self, send, param, grad):
        """Copy ``param``'s gradient into this bucket's reduce-scatter send buffer."""
        if self._offset_of is None:
            self._offset_of = {id(p): o for p, o in zip(self.params, self.offsets)}
        send.narrow(0, self._offset_of[id(param)], grad.numel()).copy_(grad.reshape(-1))

    def settle(self):
        """Done touching this rank's piece for now (ZeRO-3 NVMe shards return to disk)."""

    resident = True  # the piece stays in memory between uses (``settle`` does nothing)

    @property
    def dtype(self):
        return self.buffer.dtype

    @property
    def device(self):
        return self.buffer.device


@dataclass
class ShardBucket(Bucket):
    """ZeRO-3: one partitioned parameter, whose only resident piece is this rank's
    ``ds_tensor`` (the full buffer exists only while gathered)."""

    owner: int = 0

    def piece_of(self, rank):
        if rank != self.owner:
            raise ValueError(f"ZeRO-3 rank {self.owner} holds only its own shard, not rank {rank}'s")
        return self.params[0].ds_partitioner.fetch(self.params[0])

    def settle(self):
        self.params[0].ds_partitioner.settle(self.params[0])

    @property
    def resident(self):
        return self.params[0].ds_partitioner.shard_store is None

    @property
    def dtype(self):
        return self.params[0].dtype

    @property
    def device(self):
        return self.params[0].data.device


class ShardRun:
    """ZeRO-3's unit of gradient reduction: consecutive ``ShardBucket``s of one group, dtype
    and device, at most ``reduce_bucket_size`` elements, reduce-scattered by one collective.

    The send buffer is rank-major, like the all-gather's output: block ``r`` holds piece ``r``
    of each parameter in turn, so what rank ``r`` receives is its own shards of all of them,
    back to back, which is exactly the stretch of its gradient partition these buckets cover
    (they are consecutive in the layout). Reduction per element is the same as one collective
    per parameter, so the result is bit-identical."""

    def __init__(self, members):
        self.members = members
        self.group = members[0].group
        self.params = [b.params[0] for b in members]
        self.piece = sum(b.piece for b in members)
        self.world = members[0].padded // members[0].piece
        self.padded = self.piece * self.world
        self.partition_offset = members[0].partition_offset
        self.numel = sum(b.numel for b in members)
        self._columns = {}  # id(param) -> (column, piece, whole rows, elements left over)
        column = 0
        for bucket in members:
            rows, rest = divmod(bucket.numel, bucket.piece)
            self._columns[id(bucket.params[0])] = (column, bucket.piece, rows, rest)
            column += bucket.piece

    dtype = property(lambda self: self.members[0].dtype)
    device = property(lambda self: self.members[0].device)

    fills_itself = True  # the reducer may hand over an uninitialised send buffer

    def place_grad(self, send, param, grad):
        """Cut ``grad`` (the whole gradient, ``ds_numel`` elements) into its ``world`` pieces
        and write piece ``r`` into block ``r``, zeroing the padding after it."""
        column, piece, rows, rest = self._columns[id(param)]
        blocks = send.view(self.world, self.piece).narrow(1, column, piece)
        flat = grad.view(-1) if grad.is_contiguous() else grad.reshape(-1)
        if rows == self.world:  # no padding: one copy
            blocks.copy_(flat.view(rows, piece))
            return
        if rows:
            blocks.narrow(0, 0, rows).copy_(flat.narrow(0, 0, rows * piece).view(rows, piece))
        if rest:
            blocks[rows].narrow(0, 0, rest).copy_(flat.narrow(0, rows * piece, rest))
            blocks[rows].narrow(0, rest, piece - rest).zero_()
            rows += 1
        if rows < self.world:
            blocks.narrow(0, rows, self.world - rows).zero_()

    def zero_missing(self, send, seen):
        """Before launch: parameters that received no gradient this backward contribute
        zeros."""
        for param in self.params:
            if id(param) not in seen:
                column, piece, _, _ = self._columns[id(param)]
                send.view(self.world, self.piece).narrow(1, column, piece).zero_()


def shard_runs(layouts, bucket_size):
    """Group ZeRO-3's one-parameter buckets into ``ShardRun``s of at most ``bucket_size``
    elements (a larger parameter gets a run of its own)."""
    return [ShardRun(run) for layout in layouts
            for run in bucket_runs(layout.buckets, max(int(bucket_size), 1), size=lambda b: b.padded)]


@dataclass
class GroupLayout:
    buckets: List[Bucket]
    partition_numel: int  # elements of this group one rank owns (sum of its pieces)

    @property
    def params(self):
        return [p for bucket in self.buckets for p in bucket.params]


def _kind(item):
    return item.dtype, item.device


def bucket_runs(items, bucket_size, size=lambda p: p.numel(), kind=_kind):
    """Split ``items`` (parameters, ZeRO-3's buckets, checkpoint keys...) into consecutive
    runs of one ``kind`` (dtype and device) of at most ``bucket_size`` (an item larger than
    that gets a run of its own). The one rule every ZeRO bucket is cut by; ``deepspeed.plan``
    calls it too, so predicted message sizes cannot drift from the engine's."""
    runs, current, total = [], [], 0
    for item in items:
        fits = total + size(item) <= bucket_size
        same_kind = not current or kind(current[-1]) == kind(item)
        if current and not (fits and same_kind):
            runs.append(current)
            current, total = [], 0
        current.append(item)
        total += size(item)
    if current:
        runs.append(current)
    return runs


def build_layout(param_groups, world_size, bucket_size):
    """One ``GroupLayout`` per group of ``param_groups`` (lists of parameters), with each
    parameter's data moved into its bucket buffer (parameters keep their identity; their
    ``.data`` becomes a view). ``world_size`` is one size for every group or a list with each
    group's own (a group partitioned over its own process group: experts)."""
    bucket_size = max(int(bucket_size), 1)
    sizes = (world_size if isinstance(world_size, (list, tuple))
             else [world_size] * len(param_groups))
    layouts = []
    for index, (params, world_size) in enumerate(zip(param_groups, sizes)):
        buckets, partition_offset = [], 0
        for run in bucket_runs(list(reversed(params)), bucket_size):
            offsets, numel = [], 0
            for param in run:
                offsets.append(numel)
                numel += param.numel()
            padded = -(-max(numel, 1) // world_size) * world_size
            bucket = Bucket(index, run, offsets, numel, padded, padded // world_size,
                            partition_offset)
            bucket.buffer = torch.zeros(padded, dtype=run[0].dtype, device=run[0].device)
            with torch.no_grad():
                for param, offset in zip(run, offsets):
                    view = bucket.buffer.narrow(0, offset, param.numel())
                    view.copy_(param.data.reshape(-1))
                    param.data = view.view(param.shape)
            buckets.append(bucket)
            partition_offset += bucket.piece
        layouts.append(GroupLayout(buckets, partition_offset))
    return layouts


def build_shard_layout(param_groups, world_size, rank):
    """ZeRO-3's layout: every (already partitioned) parameter is a bucket of its own whose
    piece for ``rank`` is its ``ds_tensor``; same bookkeeping, so checkpoints and re-cutting
    work unchanged."""
    layouts = []
    for index, params in enumerate(param_groups):
        buckets, partition_offset = [], 0
        for param in reversed(params):
            shard = param.ds_partitioner.shard_numel(param.ds_numel)
            buckets.append(ShardBucket(index, [param], [0], param.ds_numel, shard * world_size,
                                       shard, partition_offset, owner=rank))
            partition_offset += shard
        layouts.append(GroupLayout(buckets, partition_offset))
    return layouts


def describe(layouts, param_names):
    """The layout as plain data for checkpoints: per group, per bucket, the parameter names and
    sizes and the padded length. Enough to rebuild every parameter from all ranks' partitions."""
    return [[{"params": [param_names[id(p)] for p in b.params],
              "numels": [getattr(p, "ds_numel", None) or p.numel() for p in b.params],
              "padded": b.padded}
             for b in layout.buckets] for layout in layouts]
