"""Collectives rebuilt from ones every backend has (all_reduce, all_gather, isend/irecv).

Used when the backend refuses the native op (see `capabilities`): older gloo lacks list
`all_to_all`, `reduce_scatter` and `ReduceOp.AVG`; some backends lack `monitored_barrier`. Each
function has the native op's signature and result, and finishes before returning.

A fallback built on another op that may itself need a fallback (a reduce-scatter on an AVG
all-reduce, a list all_to_all on all_to_all_single) takes that op as its last argument:
`backend_ops` passes its own, fallback-aware version. The dependency thus points one way, from
`backend_ops` to this module, which uses only torch.distributed.
"""
import torch
import torch.distributed as dist

from deepspeed.comm.work import finished


def _rank_and_size(group):
    return dist.get_rank(group), dist.get_world_size(group)


def _global_rank(group, group_rank):
    if group is None or group is dist.group.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


def all_reduce_avg(tensor, group, async_op):
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    tensor.div_(dist.get_world_size(group))
    return finished(async_op)


def reduce_scatter_tensor(output, input, op, group, async_op, all_reduce):
    """`all_reduce(tensor, op, group, async_op)` is the all-reduce to build it from."""
    rank, size = _rank_and_size(group)
    chunk = output.numel()
    if input.numel() != size * chunk:
        raise ValueError(f"reduce_scatter_tensor: input has {input.numel()} elements but the group "
                         f"size ({size}) x output ({chunk}) is {size * chunk}")
    buffer = input.detach().reshape(-1).clone()
    all_reduce(buffer, op, group, False)
    output.copy_(buffer[rank * chunk:(rank + 1) * chunk].view(output.shape))
    return finished(async_op)


def reduce_scatter(output, input_list, op, group, async_op, all_reduce):
    """`all_reduce(tensor, op, group, async_op)` is the all-reduce to build it from."""
    rank, size = _rank_and_size(group)
    if len(input_list) != size:
        raise ValueError(f"reduce_scatter: input_list has {len(input_list)} tensors, the group has "
                         f"{size} ranks")
    sizes = [t.numel() for t in input_list]
    if sizes[rank] != output.numel():
        raise ValueError(f"reduce_scatter: output has {output.numel()} elements but "
                         f"input_list[{rank}] has {sizes[rank]}")
    buffer = torch.cat([t.detach().reshape(-1) for t in input_list])
    all_reduce(buffer, op, group, False)
    start = sum(sizes[:rank])
    output.copy_(buffer[start:start + sizes[rank]].view(output.shape))
    return finished(async_op)


def all_gather_into_tensor(output, input, group, async_op):
    _, size = _rank_and_size(group)
    chunk = input.numel()
    if output.numel() != size * chunk:
        raise ValueError(f"all_gather_into_tensor: output has {output.numel()} elements but the "
                         f"group size ({size}) x input ({chunk}) is {size * chunk}")
    flat = output if output.is_contiguous() else torch.empty(
        output.numel(), dtype=output.dtype, device=output.device)
    parts = [part.view(input.shape) for part in flat.view(-1).split(chunk)]
    dist.all_gather(parts, input.contiguous(), group=group)
    if flat is not output:
        output.copy_(flat.view(output.shape))
    return finished(async_op)


def _split_sizes(tensor, sizes, size, what):
    if sizes is None:
        if tensor.size(0) % size:
            raise ValueError(f"all_to_all_single: {what} dim 0 ({tensor.size(0)}) is not divisible "
                             f"by the group size ({size}); pass {what}_split_sizes")
        return [tensor.size(0) // size] * size
    sizes = list(sizes)
    if len(sizes) != size or sum(sizes) != tensor.size(0):
        raise ValueError(f"all_to_all_single: {what}_split_sizes={sizes} must have {size} entries "
                         f"summing to {what} dim 0 ({tensor.size(0)})")
    return sizes


def all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, async_op):
    rank, size = _rank_and_size(group)
    sends = input.split(_split_sizes(input, input_split_sizes, size, "input"), dim=0)
    receives = output.split(_split_sizes(output, output_split_sizes, size, "output"), dim=0)
    receives[rank].copy_(sends[rank])
    pending, landed = [], []
    for peer in range(size):
        # both sides know the chunk size, so both skip empty chunks alike
        if peer == rank or receives[peer].numel() + sends[peer].numel() == 0:
            continue
        peer_global = _global_rank(group, peer)
        if receives[peer].numel():
            buffer = torch.empty_like(receives[peer], memory_format=torch.contiguous_format)
            pending.append(dist.irecv(buffer, src=peer_global, group=group))
            landed.append((receives[peer], buffer))
        if sends[peer].numel():
            pending.append(dist.isend(sends[peer].contiguous(), dst=peer_global, group=group))
    for work in pending:
        work.wait()
    for target, buffer in landed:
        target.copy_(buffer)
    return finished(async_op)


def all_to_all(output_list, input_list, group, async_op, all_to_all_single):
    """`all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, async_op)`
    is the op to build it from."""
    _, size = _rank_and_size(group)
    if len(input_list) != size or len(output_list) != size:
        raise ValueError(f"all_to_all: got {len(input_list)} inputs and {len(output_list)} outputs "
                         f"for a group of {size} ranks")
    dtypes = {t.dtype for t in (*input_list, *output_list)}
    if len(dtypes) != 1:
        raise ValueError(f"all_to_all: every tensor must have one dtype, got "
                         f"{sorted(map(str, dtypes))}")
    send = torch.cat([t.detach().reshape(-1) for t in input_list])
    receive = torch.empty(sum(t.numel() for t in output_list), dtype=send.dtype, device=send.device)
    all_to_all_single(receive, send, [t.numel() for t in output_list],
                      [t.numel() for t in input_list], group, False)
    start = 0
    for target in output_list:
        target.copy_(receive[start:start + target.numel()].view(target.shape))
        start += target.numel()
    return finished(async_op)


def monitored_barrier(group, timeout, wait_all_ranks):
    dist.barrier(group=group)
