"""Which gradient columns are important: ZenFlow's top-k selection over ZeRO partitions.

A *column* of a weight with full shape ``(rows, ...)`` is one of its ``numel / rows`` input
positions: element ``e`` of the row-major flattened weight is in column ``e % cols``. Weights
with fewer than two dimensions (biases, norms) are small and always important.

Each rank holds only a contiguous fragment of each flattened gradient (ZeRO stage 2/3), so it
sums the squares it holds per column; one all-reduce gives every rank the same column norms, hence
the same selection. The result is, per optimizer param group, the positions of the important
elements inside this rank's flat partition.
"""
import math

import torch

from deepspeed import comm as dist


def full_shape(param):
    return tuple(param.ds_shape) if hasattr(param, "ds_id") else tuple(param.shape)


def columns_of(param):
    """Columns of a weight, None for a tensor with fewer than two dimensions."""
    shape = full_shape(param)
    if len(shape) < 2 or shape[0] == 0:
        return None
    return math.prod(shape) // shape[0]


def _column_ids(frag, cols, device):
    return torch.arange(frag.start, frag.start + frag.length, device=device) % cols


def column_sq_norms(optimizer):
    """(plans, norms): per managed parameter ``(group, fragment, cols, slice of norms)``, and the
    data-parallel sum of squared gradient norms of every column of every weight."""
    plans, parts, at = [], [], 0
    for group, params in enumerate(optimizer.partitioned_params):
        grads = optimizer.grad_partitions[group]
        for param in params:
            frag = optimizer.fragment_of(param)
            cols = columns_of(param)
            if cols is None:
                plans.append((group, frag, None, None))
                continue
            sq = torch.zeros(cols, dtype=torch.float32, device=grads.device)
            if frag.length:
                piece = grads.narrow(0, frag.partition_offset, frag.length).float()
                sq.index_add_(0, _column_ids(frag, cols, grads.device), piece * piece)
            plans.append((group, frag, cols, slice(at, at + cols)))
            parts.append(sq)
            at += cols
    norms = torch.cat(parts) if parts else torch.zeros(0)
    if norms.numel():
        dist.all_reduce(norms, group=optimizer.dp_group)
    return plans, norms


def important_positions(optimizer, topk_ratio):
    """Per param group, a sorted LongTensor of this rank's partition positions to update every
    step: the top ``ceil(topk_ratio * cols)`` columns of each weight by gradient norm, plus
    every element of tensors with fewer than two dimensions."""
    plans, norms = column_sq_norms(optimizer)
    found = [[] for _ in optimizer.partitioned_params]
    for group, frag, cols, span in plans:
        if not frag.length:
            continue
        device = optimizer.grad_partitions[group].device
        local = torch.arange(frag.length, device=device) + frag.partition_offset
        if cols is None:
            found[group].append(local)
            continue
        k = min(math.ceil(topk_ratio * cols), cols)
        if k == cols:
            found[group].append(local)
        elif k > 0:
            chosen = torch.zeros(cols, dtype=torch.bool, device=device)
            chosen[torch.topk(norms[span], k, sorted=False).indices] = True
            found[group].append(local[chosen[_column_ids(frag, cols, device)]])
    return [torch.sort(torch.cat(f))[0] if f else torch.zeros(0, dtype=torch.long)
            for f in found]
