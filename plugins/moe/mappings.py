"""Splitting an MoE layer's token slots over the tensor-parallel ranks and joining them back
(``deepspeed.moe.mappings``, upstream's module and names).

With tensor (model) parallelism every tensor-parallel rank holds the same activations, so an
MoE layer whose experts are *not* tensor parallel would run each expert ``tp`` times on the
same tokens. Instead each rank keeps only its ``1/tp`` slice of the dispatched slots
(``drop_tokens``), sends that through the experts, and the slices are all-gathered back across
the tensor-parallel group afterwards (``gather_tokens``). Both are autograd functions the way
Megatron writes its region mappings: the backward of the slice is a gather, the backward of
the gather is a slice. That relies on the upstream gradient being the same on every
tensor-parallel rank (it is: the layers after the MoE are replicated or tensor parallel in
Megatron's sense), and it leaves each rank's experts with the gradient of its own slice only,
which is why such experts sum their gradients over every tensor-parallel rank too
(``deepspeed.moe.groups._get_expert_replica_group``).
"""
import torch

from deepspeed import comm as dist


def _tp_group_and_size(group):
    """``(group, size)``: ``group``, else the current topology's model-parallel group."""
    from deepspeed import topology
    from deepspeed.moe.groups import tensor_dim

    if group is None:
        topo = topology.current()
        if topo.size(tensor_dim(topo)) == 1:
            return None, 1
        group = topo.group(tensor_dim(topo))
    return group, dist.get_world_size(group=group)


def _slice(tensor, dim, group, size):
    if tensor.shape[dim] % size != 0:
        raise ValueError(f"cannot split dimension {dim} of size {tensor.shape[dim]} (shape "
                         f"{tuple(tensor.shape)}) evenly over {size} tensor-parallel ranks")
    rank = dist.get_rank(group=group)
    return tensor.chunk(size, dim=dim)[rank].contiguous()


def _gather(tensor, dim, group, size):
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor, group=group)
    return torch.cat(parts, dim=dim)


class _DropTokens(torch.autograd.Function):
    """This rank's slice of ``dim``; backward: the slices' gradients gathered."""

    @staticmethod
    def forward(ctx, tensor, dim, group, size):
        ctx.dim, ctx.group, ctx.size = dim, group, size
        return _slice(tensor, dim, group, size)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.dim, ctx.group, ctx.size), None, None, None


class _GatherTokens(torch.autograd.Function):
    """Every rank's slice concatenated along ``dim``; backward: this rank's slice."""

    @staticmethod
    def forward(ctx, tensor, dim, group, size):
        ctx.dim, ctx.group, ctx.size = dim, group, size
        return _gather(tensor, dim, group, size)

    @staticmethod
    def backward(ctx, grad):
        return _slice(grad, ctx.dim, ctx.group, ctx.size), None, None, None


def drop_tokens(input_, dim=0, group=None):
    """This tensor-parallel rank's ``1/tp`` slice of ``input_`` along ``dim`` (identity
    without tensor parallelism). ``dim`` must divide evenly."""
    group, size = _tp_group_and_size(group)
    if size == 1:
        return input_
    return _DropTokens.apply(input_, dim, group, size)


def gather_tokens(input_, dim=0, group=None):
    """The tensor-parallel ranks' slices of ``input_`` concatenated along ``dim`` in rank
    order (identity without tensor parallelism)."""
    group, size = _tp_group_and_size(group)
    if size == 1:
        return input_
    return _GatherTokens.apply(input_, dim, group, size)
