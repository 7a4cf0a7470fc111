"""Where each element of a ZeRO checkpoint's flat partitions belongs: plain arithmetic over the
layout that ``deepspeed.zero.partition.describe`` records in every ``*_optim_states.pt`` file.

A described layout is, per optimizer param group, a list of buckets ``{"params": [names],
"numels": [sizes], "padded": length}``; each bucket's ``padded`` elements are cut into ``N``
equal pieces and rank ``r``'s partition of the group is the concatenation of its pieces over
the buckets (ZeRO-3: one bucket per parameter). Re-cutting a checkpoint for another world size
or bucket size (``checkpointing.reshape``), loading a universal checkpoint (``universal``) and
converting to one (``ds_to_universal``) all go through these functions.

``partition_ranges`` is defined in ``zero_to_fp32``, the offline script that is copied into
every ZeRO checkpoint and must run without DeepSpeed, and re-exported here so that the files'
writer and all their readers share one definition. Needs only torch: no process group, config
or ZeRO optimizer.
"""
from typing import Dict

import torch

from deepspeed.zero.zero_to_fp32 import partition_ranges

__all__ = ["partition_ranges", "partition_numel", "assemble", "split"]


def partition_numel(described_group, world_size):
    """Elements of one rank's partition of one described group (padding included)."""
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
