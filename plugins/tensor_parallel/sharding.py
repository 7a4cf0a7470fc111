"""How a tensor-parallel rank's slice of a tensor is chosen, and how it is remembered.

Sizes that ``tp_size`` does not divide are split unevenly (the first ``size % tp_size`` ranks
hold one more row), the same rule on every call, so a column-parallel layer and the row-parallel
layer reading its output always agree. Every parameter AutoTP creates carries the function that
cuts it out of the full tensor (``ds_shard_fn``): the checkpoint loader applies it to each
tensor it reads, so a rank copies only its own slice and never holds the whole model.
"""
import torch

from deepspeed.checkpoint.universal import piece_range, piece_sizes

SHARD_FN = "ds_shard_fn"
# a parameter's key in the full state dict when it differs from its module path (a rank's
# local expert 0 is expert ``ep_rank * local_experts`` of the checkpoint)
CHECKPOINT_KEY = "ds_checkpoint_key"
# set (to the block count, 3) on a Linear whose output rows are fused equal blocks over all
# heads, ``[q; k; v]``: AutoTP gives each rank its heads' rows of every block
# (``fused_narrow_fn``) instead of one contiguous slice
FUSED_BLOCKS = "ds_fused_blocks"


def shard_sizes(total, tp_size):
    """``tp_size`` sizes summing to ``total``; the first ``total % tp_size`` are one larger
    (the universal checkpoint's rule for pieces, so its loaders cut the same slices)."""
    return piece_sizes(total, tp_size)


def shard_range(total, tp_size, rank):
    """``(start, length)`` of ``rank``'s part of ``total`` rows."""
    return piece_range(total, tp_size, rank)


def narrow_fn(dim, tp_size, rank):
    """The function taking ``rank``'s slice of a full tensor along ``dim``."""
    def take(full):
        start, length = shard_range(full.shape[dim], tp_size, rank)
        return full.narrow(dim, start, length)
    return take


def fused_narrow_fn(dim, blocks, tp_size, rank):
    """The function taking ``rank``'s slice of each of the ``blocks`` equal blocks a fused
    tensor holds along ``dim``, concatenated: a fused ``[q; k; v]`` projection (``blocks`` 3)
    gives each rank ``[q_r; k_r; v_r]``, the rows of its own heads in each block."""
    def take(full):
        if full.shape[dim] % blocks:
            raise ValueError(f"a fused tensor of {full.shape[dim]} rows along dim {dim} does not "
                             f"split into {blocks} equal blocks")
        return torch.cat([block.narrow(dim, *shard_range(block.shape[dim], tp_size, rank))
                          for block in full.chunk(blocks, dim)], dim=dim)
    return take


def take_shard(tensor, fn):
    """``fn(tensor)`` as a detached tensor with its own storage (the full one can be freed)."""
    return fn(tensor).clone().detach()


def mark(param, fn):
    """Remember on ``param`` how it is cut from the full tensor (for checkpoint loading)."""
    setattr(param, SHARD_FN, fn)
    return param


def shard_of(param, full):
    """``param``'s part of the checkpoint tensor ``full`` (all of it for an unsplit one)."""
    fn = getattr(param, SHARD_FN, None)
    return full if fn is None else fn(full)


def replace_everywhere(root, old, new):
    """Put ``new`` wherever ``old`` is a child in ``root`` (a module shared by several parents,
    like T5's ``shared`` embedding, is replaced in all of them). Returns the count."""
    count = 0
    for module in root.modules():
        for name, child in list(module._modules.items()):
            if child is old:
                module._modules[name] = new
                count += 1
    return count


def parameter_bytes(module):
    """Bytes of ``module``'s parameters that hold real storage (meta tensors count 0; a
    parameter shared by several modules counts once; buffers are not counted)."""
    seen, total = set(), 0
    for p in module.parameters():
        if id(p) in seen or p.device.type == "meta":
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    return total


def frozen(tensor):
    return tensor if isinstance(tensor, torch.nn.Parameter) else torch.nn.Parameter(
        tensor, requires_grad=False)
