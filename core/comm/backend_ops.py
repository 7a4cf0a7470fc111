"""The collectives as the backend runs them, each falling back when the backend lacks it.

No timing and no error translation here (that is `collectives`); this layer only guarantees that
every op exists whatever the torch version and backend. Where torch renamed an op (2.13 deprecates
`all_gather_into_tensor` / `reduce_scatter_tensor` for `*_single`), the current name is used so
callers see no deprecation warnings.
"""
import torch
import torch.distributed as dist

from deepspeed.comm import capabilities, fallbacks
from deepspeed.comm.work import finished

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


# Backends that take accelerator tensors only: NCCL rejects a host tensor ("No backend type
# associated with device type cpu"). The small host tensors of a step (an overflow flag, a
# norm's sum of squares, a count) are staged through the accelerator for all_reduce and
# broadcast, so code written against gloo runs unchanged over NCCL; bulk data is already on
# the device and never takes this path.
DEVICE_ONLY_BACKENDS = {"nccl"}


def _host_on_device_only_backend(tensor, group):
    return tensor.device.type == "cpu" and backend_of(group) in DEVICE_ONLY_BACKENDS


def _staged(tensor, run, async_op):
    """``run(device_copy)`` on an accelerator copy of host ``tensor``; the result is copied
    back when the op completes (at once, or at the returned work's ``wait``)."""
    from deepspeed.accelerator import get_accelerator  # lazy: the accelerator imports comm

    staged = tensor.to(get_accelerator().current_device_name())
    work = run(staged)
    if not async_op:
        tensor.copy_(staged)
        return work
    return _ThenFinish(work, lambda: tensor.copy_(staged))


def broadcast(tensor, src, group, async_op):
    if _host_on_device_only_backend(tensor, group):
        return _staged(tensor, lambda t: dist.broadcast(t, src, group=group, async_op=async_op),
                       async_op)
    return dist.broadcast(tensor, src, group=group, async_op=async_op)


def all_reduce(tensor, op, group, async_op):
    if _host_on_device_only_backend(tensor, group):
        return _staged(tensor, lambda t: _all_reduce(t, op, group, async_op), async_op)
    return _all_reduce(tensor, op, group, async_op)


def _all_reduce(tensor, op, group, async_op):
    if op == dist.ReduceOp.AVG:
        return capabilities.call(
            "all_reduce_avg", backend_of(group),
            lambda: dist.all_reduce(tensor, op=op, group=group, async_op=async_op),
            lambda: fallbacks.all_reduce_avg(tensor, group, async_op))
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


# gloo's reduce-scatter is slower than its ring all-reduce of the whole tensor, and both are
# slower than each rank sending every other rank that rank's piece and summing what it receives
# (3.2 M fp32, 2 ranks, one thread each, in isolation: native 16.4 ms, all-reduce of a copy 10.2
# ms, exchange 4.5 ms; ZeRO-3's end-of-backward reduce-scatter in tools/bench/zero_bench.py's
# larger GPT: 13.0 -> 8.6 ms). So on gloo a sum (or average) reduce-scatter of pieces of at least
# EXCHANGE_MIN_PIECE_BYTES is that exchange; anything else is an all-reduce of a copy of the
# input, of which each rank keeps its piece. Below that size the exchange wins in isolation but
# loses inside a training step (the demo GPT's 200 KB pieces: ZeRO-3 1.19-1.23x DDP against
# 1.12-1.17x), where its receives and sums compete with compute on the same cores. The exchange
# sums the received pieces in a fixed order (the first peer's, the other peers' in rank order,
# one's own last), the same on every run. (An all-gather by the same exchange was tried too:
# faster in isolation, 3-5% slower ZeRO-3 backward, where gathers are prefetched; not used.)
EXCHANGE_FOR_REDUCE_SCATTER = {"gloo"}
EXCHANGE_OPS = (dist.ReduceOp.SUM, dist.ReduceOp.AVG)
EXCHANGE_MIN_PIECE_BYTES = 1 << 20
# the point-to-point tag of the exchange's messages: its own, so that a pipeline's activations
# (tag 0) between the same two ranks never pair with a gradient piece
EXCHANGE_TAG = 0x5253


class _ThenFinish:
    """A torch Work (or several) whose first ``wait`` also runs ``finish`` (the copy-out, or
    the sum of the received pieces)."""

    def __init__(self, work, finish):
        self._works = work if isinstance(work, list) else [work]
        self._finish = finish

    def wait(self, timeout=None):
        done = True
        for work in self._works:
            done = (work.wait() if timeout is None else work.wait(timeout)) and done
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        return done

    def is_completed(self):
        """Waits, then True: gloo's point-to-point works report completion only from
        ``wait()``, so a caller polling this instead of waiting would otherwise spin forever;
        this way it reads a finished result (after blocking once)."""
        self.wait()
        return True

    def __getattr__(self, name):
        return getattr(self.__dict__["_works"][0], name)


def _checked_chunk(output, input, size):
    chunk = output.numel()
    if input.numel() != size * chunk:
        raise ValueError(f"reduce_scatter_tensor: input has {input.numel()} elements but the group "
                         f"size ({size}) x output ({chunk}) is {size * chunk}")
    return chunk


def _reduce_scatter_by_all_reduce(output, input, op, group, async_op, input_is_scratch):
    size = dist.get_world_size(group)
    chunk = _checked_chunk(output, input, size)
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
    return _ThenFinish(work, finish)


def _overlaps(a, b):
    """Whether ``a`` and ``b`` share any byte (an in-place reduce-scatter into a piece of its
    own input cannot receive there before its own piece is read)."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _exchange_reduces(output, input, op):
    """Whether the exchange runs this reduce-scatter (see EXCHANGE_FOR_REDUCE_SCATTER)."""
    return op in EXCHANGE_OPS and output.is_contiguous() and not _overlaps(output, input) \
        and output.numel() * output.element_size() >= EXCHANGE_MIN_PIECE_BYTES


def _reduce_scatter_by_exchange(output, input, op, group, async_op):
    """Rank ``r``'s piece of ``input`` goes to rank ``r``; each rank sums the pieces it
    receives with its own into ``output`` (the first one received straight into it). The
    input is only read; ``output`` must not overlap it."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    chunk = _checked_chunk(output, input, size)
    pieces = input.detach().reshape(-1).split(chunk)
    flat_out = output.view(-1)
    peers = [r for r in range(size) if r != rank]
    inboxes = [flat_out] + [torch.empty_like(flat_out) for _ in peers[1:]]
    works = []
    for peer, inbox in zip(peers, inboxes):
        # post the receive before the send: gloo pairs them by (peer, tag) in posting order
        works.append(dist.irecv(inbox, group=group, group_src=peer, tag=EXCHANGE_TAG))
        works.append(dist.isend(pieces[peer], group=group, group_dst=peer, tag=EXCHANGE_TAG))

    def finish():
        for inbox in inboxes[1:]:
            flat_out.add_(inbox)
        flat_out.add_(pieces[rank])
        if op == dist.ReduceOp.AVG:
            flat_out.div_(size)

    work = _ThenFinish(works, finish)
    if not async_op:
        work.wait()
        return None
    return work


def reduce_scatter_tensor(output, input, op, group, async_op, input_is_scratch=False):
    if backend_of(group) in EXCHANGE_FOR_REDUCE_SCATTER:
        if dist.get_world_size(group) == 1:
            output.copy_(input.reshape(output.shape))
            return finished(async_op)
        if _exchange_reduces(output, input, op):
            return _reduce_scatter_by_exchange(output, input, op, group, async_op)
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
