"""The collective and point-to-point ops of deepspeed.comm, matching torch.distributed's signatures.

Each op goes through `_call`, which adds what torch does not: `CommTimeoutError` naming the rank,
op, group size and timeout; and, only while a comm observer is registered, timing with device
synchronisation and a `CommRecord`. The extra keywords `prof` and `log_name` are the comms
logger's (a forced log entry and a display name); `debug` names the caller explicitly.
"""
import os
import sys
import time

import torch.distributed as dist

from deepspeed.comm import backend_ops, observers, state
from deepspeed.comm.errors import is_timeout_error, timeout_error
from deepspeed.comm.groups import ReduceOp, _require_initialized
from deepspeed.comm.work import WorkHandle


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _rank():
    if dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "-1"))


def _group_size(group):
    return dist.get_world_size(group) if dist.is_initialized() else 0


def _group_ranks(group):
    if not dist.is_initialized():
        return None
    return tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))


def _timeout_error(exc, op, group):
    return timeout_error(exc, rank=_rank(), op=op, group_size=_group_size(group),
                         timeout=state.timeout_of(group))


def _synchronize():
    from deepspeed.accelerator import get_accelerator  # lazy: the accelerator may import comm

    get_accelerator().synchronize()


def _caller_name():
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("deepspeed.comm"):
        frame = frame.f_back
    return frame.f_code.co_name if frame is not None else None


def _call(op, launch, *, group=None, size=0, async_op=False, log_name=None, prof=False,
          debug=None, observe=True):
    """Run `launch()` (the backend call); time and report it when observed; translate timeouts."""
    _require_initialized(op)
    if not (observe and observers.observing()):
        try:
            result = launch()
        except RuntimeError as exc:
            if is_timeout_error(exc):
                raise _timeout_error(exc, op, group) from exc
            raise
        if async_op and result is not None:
            return WorkHandle(result, lambda exc: _timeout_error(exc, op, group))
        return result

    caller = debug if isinstance(debug, str) else _caller_name()
    if not async_op:
        _synchronize()
    start = time.perf_counter()
    try:
        result = launch()
    except RuntimeError as exc:
        if is_timeout_error(exc):
            raise _timeout_error(exc, op, group) from exc
        raise

    def report():
        _synchronize()
        latency = time.perf_counter() - start
        group_size = _group_size(group)
        algbw, busbw = observers.bandwidth(op, size, latency, group_size)
        observers.emit(observers.CommRecord(
            op=op, log_name=log_name or op, size_bytes=size, latency_s=latency,
            group_size=group_size, rank=_rank(), algbw_gbps=algbw, busbw_gbps=busbw,
            async_op=async_op, prof=bool(prof), caller=caller, group_ranks=_group_ranks(group)))

    if async_op and result is not None:
        return WorkHandle(result, lambda exc: _timeout_error(exc, op, group), on_complete=report)
    report()
    return result


# --------------------------------------------------------------------------- reductions
def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
               log_name="all_reduce", debug=None):
    return _call("all_reduce", lambda: backend_ops.all_reduce(tensor, op, group, async_op),
                 group=group, size=_nbytes(tensor), async_op=async_op, log_name=log_name,
                 prof=prof, debug=debug)


def inference_all_reduce(tensor, op=ReduceOp.SUM, group=None, prof=False,
                         log_name="inference_all_reduce", debug=None):
    """A blocking all-reduce for inference's tensor parallelism (always synchronous)."""
    return _call("inference_all_reduce", lambda: backend_ops.all_reduce(tensor, op, group, False),
                 group=group, size=_nbytes(tensor), log_name=log_name, prof=prof, debug=debug)


def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
           log_name="reduce", debug=None):
    return _call("reduce", lambda: dist.reduce(tensor, dst, op=op, group=group, async_op=async_op),
                 group=group, size=_nbytes(tensor), async_op=async_op, log_name=log_name,
                 prof=prof, debug=debug)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False, prof=False,
                   log_name="reduce_scatter", debug=None):
    return _call("reduce_scatter",
                 lambda: backend_ops.reduce_scatter(output, input_list, op, group, async_op),
                 group=group, size=_nbytes(output), async_op=async_op, log_name=log_name,
                 prof=prof, debug=debug)


def reduce_scatter_tensor(output_tensor, input_tensor, op=ReduceOp.SUM, group=None,
                          async_op=False, prof=False, log_name="reduce_scatter_tensor", debug=None,
                          input_is_scratch=False):
    """``input_is_scratch=True`` (not in torch): the caller never reads ``input_tensor`` again,
    so a backend that runs a reduce-scatter as an all-reduce (gloo) may reduce it in place
    instead of in an input-sized copy (ZeRO's gradient buckets: one bucket less of peak)."""
    return _call("reduce_scatter_tensor",
                 lambda: backend_ops.reduce_scatter_tensor(output_tensor, input_tensor, op, group,
                                                           async_op, input_is_scratch),
                 group=group, size=_nbytes(output_tensor), async_op=async_op, log_name=log_name,
                 prof=prof, debug=debug)


def reduce_scatter_fn(output_tensor, tensor, op=ReduceOp.SUM, group=None, async_op=False,
                      prof=False, debug=None):
    """Upstream's name for reduce_scatter_tensor (ZeRO code calls it)."""
    return reduce_scatter_tensor(output_tensor, tensor, op=op, group=group, async_op=async_op,
                                 prof=prof, log_name="reduce_scatter_fn", debug=debug)


# --------------------------------------------------------------------------- gathers
def all_gather(tensor_list, tensor, group=None, async_op=False, prof=False, log_name="all_gather",
               debug=None):
    return _call("all_gather",
                 lambda: dist.all_gather(tensor_list, tensor, group=group, async_op=async_op),
                 group=group, size=_nbytes(tensor), async_op=async_op, log_name=log_name,
                 prof=prof, debug=debug)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, prof=False,
                           log_name="all_gather_into_tensor", debug=None):
    return _call("all_gather_into_tensor",
                 lambda: backend_ops.all_gather_into_tensor(output_tensor, input_tensor, group,
                                                            async_op),
                 group=group, size=_nbytes(input_tensor), async_op=async_op, log_name=log_name,
                 prof=prof, debug=debug)


def allgather_fn(output_tensor, input_tensor, group=None, async_op=False, debug=None):
    """Upstream's name for all_gather_into_tensor (ZeRO code calls it)."""
    return all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op,
                                  log_name="allgather_fn", debug=debug)


def gather(tensor, gather_list=None, dst=0, group=None, async_op=False, prof=False,
           log_name="gather", debug=None):
    return _call("gather",
                 lambda: dist.gather(tensor, gather_list, dst=dst, group=group, async_op=async_op),
                 group=group, size=_nbytes(tensor), async_op=async_op, log_name=log_name,
                 prof=prof, debug=debug)


def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False, prof=False,
            log_name="scatter", debug=None):
    return _call("scatter",
                 lambda: dist.scatter(tensor, scatter_list, src=src, group=group,
                                      async_op=async_op),
                 group=group, size=_nbytes(tensor), async_op=async_op, log_name=log_name,
                 prof=prof, debug=debug)


def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False, prof=False, log_name="all_to_all_single", debug=None):
    return _call("all_to_all_single",
                 lambda: backend_ops.all_to_all_single(output, tensor, output_split_sizes,
                                                       input_split_sizes, group, async_op),
                 group=group, size=_nbytes(tensor), async_op=async_op, log_name=log_name,
                 prof=prof, debug=debug)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False, prof=False,
               log_name="all_to_all", debug=None):
    return _call("all_to_all",
                 lambda: backend_ops.all_to_all(output_tensor_list, input_tensor_list, group,
                                                async_op),
                 group=group, size=sum(_nbytes(t) for t in input_tensor_list), async_op=async_op,
                 log_name=log_name, prof=prof, debug=debug)


# --------------------------------------------------------------------------- broadcast, p2p, sync
def broadcast(tensor, src, group=None, async_op=False, prof=False, log_name="broadcast",
              debug=None):
    return _call("broadcast",
                 lambda: backend_ops.broadcast(tensor, src, group, async_op),
                 group=group, size=_nbytes(tensor), async_op=async_op, log_name=log_name,
                 prof=prof, debug=debug)


def send(tensor, dst, group=None, tag=0, prof=False, log_name="send", debug=None):
    return _call("send", lambda: dist.send(tensor, dst, group=group, tag=tag), group=group,
                 size=_nbytes(tensor), log_name=log_name, prof=prof, debug=debug)


def recv(tensor, src=None, group=None, tag=0, prof=False, log_name="recv", debug=None):
    """Returns the sender's rank, as torch does."""
    return _call("recv", lambda: dist.recv(tensor, src, group=group, tag=tag), group=group,
                 size=_nbytes(tensor), log_name=log_name, prof=prof, debug=debug)


def isend(tensor, dst, group=None, tag=0, prof=False, log_name="isend", debug=None):
    return _call("isend", lambda: dist.isend(tensor, dst, group=group, tag=tag), group=group,
                 size=_nbytes(tensor), async_op=True, log_name=log_name, prof=prof, debug=debug)


def irecv(tensor, src=None, group=None, tag=0, prof=False, log_name="irecv", debug=None):
    return _call("irecv", lambda: dist.irecv(tensor, src, group=group, tag=tag), group=group,
                 size=_nbytes(tensor), async_op=True, log_name=log_name, prof=prof, debug=debug)


def barrier(group=None, async_op=False, device_ids=None, prof=False, log_name="barrier",
            debug=None):
    return _call("barrier",
                 lambda: dist.barrier(group=group, async_op=async_op, device_ids=device_ids),
                 group=group, async_op=async_op, log_name=log_name, prof=prof, debug=debug)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False, prof=False,
                      log_name="monitored_barrier", debug=None):
    """A barrier that names the ranks that did not arrive (gloo); a plain barrier elsewhere."""
    return _call("monitored_barrier",
                 lambda: backend_ops.monitored_barrier(group, timeout, wait_all_ranks),
                 group=group, log_name=log_name, prof=prof, debug=debug)


# --------------------------------------------------------------------------- python objects
def broadcast_object_list(object_list, src=0, group=None, device=None):
    """Not timed: the pickled size is known only inside torch."""
    return _call("broadcast_object_list",
                 lambda: dist.broadcast_object_list(object_list, src=src, group=group,
                                                    device=device),
                 group=group, observe=False)


def all_gather_object(object_list, obj, group=None):
    """Not timed: the pickled size is known only inside torch."""
    return _call("all_gather_object", lambda: dist.all_gather_object(object_list, obj, group=group),
                 group=group, observe=False)
