"""The collectives as the backend runs them, each falling back when the backend lacks it.

No timing and no error translation here (that is `collectives`); this layer only guarantees that
every op exists whatever the torch version and backend. Where torch renamed an op (2.13 deprecates
`all_gather_into_tensor` / `reduce_scatter_tensor` for `*_single`), the current name is used so
callers see no deprecation warnings.
"""
import torch.distributed as dist

from deepspeed.comm import capabilities, fallbacks

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _concatenated(big, small):
    """`big` in torch's "concatenation" layout (n*k, ...) when given in the "stack" (n, k, ...).

    torch documents both layouts for all_gather_into_tensor / reduce_scatter_tensor, but gloo
    accepts only the first.
    """
    if small.dim() > 0 and big.dim() == small.dim() + 1 and big.is_contiguous():
        return big.view(-1, *small.shape[1:])
    return big


def backend_of(group) -> str:
    return str(dist.get_backend(group))


def all_reduce(tensor, op, group, async_op):
    if op == dist.ReduceOp.AVG:
        return capabilities.call(
            "all_reduce_avg", backend_of(group),
            lambda: dist.all_reduce(tensor, op=op, group=group, async_op=async_op),
            lambda: fallbacks.all_reduce_avg(tensor, group, async_op))
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


# gloo's reduce-scatter is slower than its ring all-reduce of the whole tensor (3.2 M fp32, 2
# ranks, one thread each: 18.9 ms against 10.0 ms; 3 ranks: 48 against 35 ms), so on gloo a
# reduce-scatter is an all-reduce of a copy of the input, of which each rank keeps its piece
ALL_REDUCE_FOR_REDUCE_SCATTER = {"gloo"}


class _ThenCopy:
    """A torch Work whose first ``wait`` also runs ``finish`` (the piece's copy-out)."""

    def __init__(self, work, finish):
        self._work, self._finish = work, finish

    def wait(self, timeout=None):
        done = self._work.wait() if timeout is None else self._work.wait(timeout)
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        return done

    def __getattr__(self, name):
        return getattr(self.__dict__["_work"], name)


def _reduce_scatter_by_all_reduce(output, input, op, group, async_op, input_is_scratch):
    chunk = output.numel()
    size = dist.get_world_size(group)
    if input.numel() != size * chunk:
        raise ValueError(f"reduce_scatter_tensor: input has {input.numel()} elements but the group "
                         f"size ({size}) x output ({chunk}) is {size * chunk}")
    buffer = input.detach().reshape(-1)
    if not input_is_scratch:  # the input stays as it was, as torch promises
        buffer = buffer.clone()
    work = dist.all_reduce(buffer, op=op, group=group, async_op=async_op)
    rank = dist.get_rank(group)

    def finish():
        output.copy_(buffer.narrow(0, rank * chunk, chunk).view(output.shape))

    if not async_op:
        finish()
        return None
    return _ThenCopy(work, finish)


def reduce_scatter_tensor(output, input, op, group, async_op, input_is_scratch=False):
    if backend_of(group) in ALL_REDUCE_FOR_REDUCE_SCATTER:
        return _reduce_scatter_by_all_reduce(output, input, op, group, async_op, input_is_scratch)
    return capabilities.call(
        "reduce_scatter_tensor", backend_of(group),
        lambda: _reduce_scatter_single(output, _concatenated(input, output), op=op, group=group,
                                       async_op=async_op),
        lambda: fallbacks.reduce_scatter_tensor(output, input, op, group, async_op, all_reduce))


def reduce_scatter(output, input_list, op, group, async_op):
    return capabilities.call(
        "reduce_scatter", backend_of(group),
        lambda: dist.reduce_scatter(output, input_list, op=op, group=group, async_op=async_op),
        lambda: fallbacks.reduce_scatter(output, input_list, op, group, async_op, all_reduce))


def all_gather_into_tensor(output, input, group, async_op):
    return capabilities.call(
        "all_gather_into_tensor", backend_of(group),
        lambda: _all_gather_single(_concatenated(output, input), input, group=group,
                                   async_op=async_op),
        lambda: fallbacks.all_gather_into_tensor(output, input, group, async_op))


def all_to_all_single(output, input, output_split_sizes, input_split_sizes, group, async_op):
    return capabilities.call(
        "all_to_all_single", backend_of(group),
        lambda: dist.all_to_all_single(output, input, output_split_sizes=output_split_sizes,
                                       input_split_sizes=input_split_sizes, group=group,
                                       async_op=async_op),
        lambda: fallbacks.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                            group, async_op))


def all_to_all(output_list, input_list, group, async_op):
    shapes = {tuple(t.shape) for t in (*output_list, *input_list)}
    if len(shapes) > 1:
        # uneven chunks: gloo's list all_to_all refuses them, all_to_all_single takes split sizes
        return fallbacks.all_to_all(output_list, input_list, group, async_op, all_to_all_single)
    return capabilities.call(
        "all_to_all", backend_of(group),
        lambda: dist.all_to_all(output_list, input_list, group=group, async_op=async_op),
        lambda: fallbacks.all_to_all(output_list, input_list, group, async_op, all_to_all_single))


def monitored_barrier(group, timeout, wait_all_ranks):
    return capabilities.call(
        "monitored_barrier", backend_of(group),
        lambda: dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks),
        lambda: fallbacks.monitored_barrier(group, timeout, wait_all_ranks))
