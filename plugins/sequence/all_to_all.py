"""The Ulysses all-to-all: re-shard a tensor from one split dimension to another across a group.

Autograd needs it as a Function because the backward of "scatter dim A, gather dim B" is exactly
the same collective with A and B swapped; torch.distributed's raw collectives carry no gradient.
"""
import torch

from deepspeed import comm as dist


def _all_to_all(tensor, group, scatter_idx, gather_idx):
    world = dist.get_world_size(group=group)
    if world == 1:
        return tensor
    size = tensor.shape[scatter_idx]
    if size % world != 0:
        raise ValueError(f"all-to-all over {world} ranks needs dimension {scatter_idx} (size {size}) "
                         f"to be divisible by {world}")
    # Chunk i goes to rank i: stacking the chunks on a new leading dim lets all_to_all_single
    # split evenly on dim 0; what comes back is [world, ...chunk] with row i from rank i.
    send = torch.stack(tensor.chunk(world, dim=scatter_idx)).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_idx).contiguous()


class SeqAllToAll(torch.autograd.Function):
    """Split ``tensor`` along ``scatter_idx`` over the ranks of ``group`` and concatenate what
    the ranks send along ``gather_idx``."""

    @staticmethod
    def forward(ctx, group, tensor, scatter_idx, gather_idx):
        ctx.group, ctx.scatter_idx, ctx.gather_idx = group, scatter_idx, gather_idx
        return _all_to_all(tensor, group, scatter_idx, gather_idx)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _all_to_all(grad_output.contiguous(), ctx.group, ctx.gather_idx, ctx.scatter_idx)
        return None, grad, None, None


def seq_all_to_all(tensor, group, scatter_idx, gather_idx):
    return SeqAllToAll.apply(group, tensor, scatter_idx, gather_idx)
