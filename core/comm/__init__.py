"""deepspeed.comm: the project's only door to torch.distributed.

`import deepspeed.comm as dist` offers torch.distributed's collectives and queries with three
additions: the backend comes from the accelerator, a collective that times out raises
`CommTimeoutError` saying which rank, op, group and timeout, and registered comm observers (the
comms logger) receive a timed `CommRecord` per op. Collectives a backend lacks (list all_to_all
or reduce_scatter on older gloo) are rebuilt from supported ones, so callers never depend on the
torch version.
"""
import sys

from deepspeed.utils import logging as _logging
from deepspeed.utils.lazy_exports import lazy_exports

# public name -> module that defines it, imported on first access (PEP 562): the launcher
# loads plugins that name this package without importing torch (a plain literal: the docs
# build reads it statically, tools/docs/griffe_lazy_exports.py)
_LAZY = {
    "all_gather": "deepspeed.comm.collectives",
    "all_gather_into_tensor": "deepspeed.comm.collectives",
    "all_gather_object": "deepspeed.comm.collectives",
    "all_reduce": "deepspeed.comm.collectives",
    "all_to_all": "deepspeed.comm.collectives",
    "all_to_all_single": "deepspeed.comm.collectives",
    "allgather_fn": "deepspeed.comm.collectives",
    "barrier": "deepspeed.comm.collectives",
    "broadcast": "deepspeed.comm.collectives",
    "broadcast_object_list": "deepspeed.comm.collectives",
    "gather": "deepspeed.comm.collectives",
    "inference_all_reduce": "deepspeed.comm.collectives",
    "irecv": "deepspeed.comm.collectives",
    "isend": "deepspeed.comm.collectives",
    "monitored_barrier": "deepspeed.comm.collectives",
    "recv": "deepspeed.comm.collectives",
    "reduce": "deepspeed.comm.collectives",
    "reduce_scatter": "deepspeed.comm.collectives",
    "reduce_scatter_fn": "deepspeed.comm.collectives",
    "reduce_scatter_tensor": "deepspeed.comm.collectives",
    "scatter": "deepspeed.comm.collectives",
    "send": "deepspeed.comm.collectives",
    "CommTimeoutError": "deepspeed.comm.errors",
    "ReduceOp": "deepspeed.comm.groups",
    "destroy_process_group": "deepspeed.comm.groups",
    "get_all_ranks_from_group": "deepspeed.comm.groups",
    "get_backend": "deepspeed.comm.groups",
    "get_global_rank": "deepspeed.comm.groups",
    "get_local_rank": "deepspeed.comm.groups",
    "get_rank": "deepspeed.comm.groups",
    "get_world_group": "deepspeed.comm.groups",
    "get_world_size": "deepspeed.comm.groups",
    "is_available": "deepspeed.comm.groups",
    "is_initialized": "deepspeed.comm.groups",
    "new_group": "deepspeed.comm.groups",
    "init_distributed": "deepspeed.comm.initialization",
    "CommRecord": "deepspeed.comm.observers",
    "CommsLoggerSettings": "deepspeed.comm.observers",
    "add_comm_observer": "deepspeed.comm.observers",
    "comm_observers": "deepspeed.comm.observers",
    "comms_logger_settings": "deepspeed.comm.observers",
    "configure": "deepspeed.comm.observers",
    "configured_comms_logger": "deepspeed.comm.observers",
    "log_summary": "deepspeed.comm.observers",
    "remove_comm_observer": "deepspeed.comm.observers",
}

__all__ = [
    "init_distributed", "is_initialized", "is_available", "get_rank", "get_world_size",
    "get_local_rank", "get_global_rank", "get_backend", "get_world_group",
    "get_all_ranks_from_group", "new_group", "destroy_process_group", "ReduceOp",
    "barrier", "monitored_barrier", "all_reduce", "inference_all_reduce", "reduce", "broadcast",
    "broadcast_object_list", "all_gather", "all_gather_object", "all_gather_into_tensor",
    "allgather_fn", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_fn",
    "all_to_all_single", "all_to_all", "gather", "scatter", "send", "recv", "isend", "irecv",
    "CommTimeoutError", "CommRecord", "add_comm_observer", "remove_comm_observer",
    "comm_observers", "configure", "configured_comms_logger", "comms_logger_settings",
    "CommsLoggerSettings",
    "log_summary",
]


def _rank_for_logs():
    """The rank `deepspeed.utils.log_dist` reports, or None before a process group is up.

    Registered into the logger, not imported by it: the logger sits below this package (which
    logs through it), so the dependency points from here down to it. Without torch.distributed
    imported no group can be up, and logging must not import it (the launcher logs too).
    """
    if "torch.distributed" not in sys.modules:
        return None
    this = sys.modules[__name__]  # the package's names (loaded on first access)
    return this.get_rank() if this.is_initialized() else None


_logging.set_rank_source(_rank_for_logs)

# the names above, then submodules, load on first attribute access (`deepspeed.comm.groups`)
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
