"""Where each element of a ZeRO checkpoint's flat partitions belongs: plain arithmetic over the
layout that ``deepspeed.zero`` records in every ``*_optim_states.pt`` file.

A described layout is, per optimizer param group, a list of buckets ``{"params": [names],
"numels": [sizes], "padded": length}``; each bucket's ``padded`` elements are cut into ``N``
equal pieces and rank ``r``'s partition of the group is the concatenation of its pieces over
the buckets (ZeRO-3: one bucket per parameter). This module needs only torch, so offline tools
(``zero_to_fp32``, ``ds_to_universal``) read checkpoints without the ZeRO plugin or a process
group.
"""
from typing import Dict

import torch


def partition_ranges(described_group, world_size, rank):
    """For one described group: ``[(name, start, stop, partition_start)]`` saying that elements
    ``start:stop`` of the flattened parameter ``name`` sit at ``partition_start`` of ``rank``'s
    partition. Padding belongs to no parameter and is left out."""
    ranges, partition_offset = [], 0
    for bucket in described_group:
        piece = bucket["padded"] // world_size
        lo, hi = rank * piece, (rank + 1) * piece
        offset = 0
        for name, numel in zip(bucket["params"], bucket["numels"]):
            start, stop = max(offset, lo), min(offset + numel, hi)
            if start < stop:
                ranges.append((name, start - offset, stop - offset,
                               partition_offset + start - lo))
            offset += numel
        partition_offset += piece
    return ranges


def partition_numel(described_group, world_size):
    return sum(b["padded"] // world_size for b in described_group)


def assemble(described_group, partitions, numels):
    """Whole flattened parameters ``{name: 1-D tensor}`` from every rank's partition of one group
    (``partitions[r]`` is rank r's flat tensor; ``numels`` maps name -> element count)."""
    world = len(partitions)
    out: Dict[str, torch.Tensor] = {}
    for rank, partition in enumerate(partitions):
        for name, start, stop, at in partition_ranges(described_group, world, rank):
            if name not in out:
                out[name] = torch.empty(numels[name], dtype=partition.dtype)
            out[name][start:stop] = partition[at:at + stop - start]
    return out


def split(described_group, world_size, rank, flat_params, dtype=torch.float32):
    """``rank``'s partition (padding zero) of one group, cut from whole flattened parameters."""
    partition = torch.zeros(partition_numel(described_group, world_size), dtype=dtype)
    for name, start, stop, at in partition_ranges(described_group, world_size, rank):
        partition[at:at + stop - start] = flat_params[name][start:stop]
    return partition
