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

from deepspeed.checkpoint.zero_layout import (assemble, partition_numel,  # noqa: F401
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

    def piece_of(self, rank):
        return self.buffer.narrow(0, rank * self.piece, self.piece)

    def settle(self):
        """Done touching this rank's piece for now (ZeRO-3 NVMe shards return to disk)."""

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
    def dtype(self):
        return self.params[0].dtype

    @property
    def device(self):
        return self.params[0].data.device


@dataclass
class GroupLayout:
    buckets: List[Bucket]
    partition_numel: int  # elements of this group one rank owns (sum of its pieces)

    @property
    def params(self):
        return [p for bucket in self.buckets for p in bucket.params]


def _pack(params, bucket_size):
    """Split ``params`` into runs of one dtype/device of at most ``bucket_size`` elements (a
    parameter larger than that gets a run of its own)."""
    runs, current, size = [], [], 0
    for param in params:
        fits = size + param.numel() <= bucket_size
        same_kind = not current or (current[-1].dtype == param.dtype
                                    and current[-1].device == param.device)
        if current and not (fits and same_kind):
            runs.append(current)
            current, size = [], 0
        current.append(param)
        size += param.numel()
    if current:
        runs.append(current)
    return runs


def build_layout(param_groups, world_size, bucket_size):
    """One ``GroupLayout`` per group of ``param_groups`` (lists of parameters), with each
    parameter's data moved into its bucket buffer (parameters keep their identity; their
    ``.data`` becomes a view)."""
    bucket_size = max(int(bucket_size), 1)
    layouts = []
    for index, params in enumerate(param_groups):
        buckets, partition_offset = [], 0
        for run in _pack(list(reversed(params)), bucket_size):
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
