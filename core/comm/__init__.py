"""deepspeed.comm: the project's only door to torch.distributed.

`import deepspeed.comm as dist` offers torch.distributed's collectives and queries with three
additions: the backend comes from the accelerator, a collective that times out raises
`CommTimeoutError` saying which rank, op, group and timeout, and registered comm observers (the
comms logger) receive a timed `CommRecord` per op. Collectives a backend lacks (list all_to_all
or reduce_scatter on older gloo) are rebuilt from supported ones, so callers never depend on the
torch version.
"""
from deepspeed.comm.collectives import (
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_reduce,
    all_to_all,
    all_to_all_single,
    allgather_fn,
    barrier,
    broadcast,
    broadcast_object_list,
    gather,
    inference_all_reduce,
    irecv,
    isend,
    monitored_barrier,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_fn,
    reduce_scatter_tensor,
    scatter,
    send,
)
from deepspeed.comm.errors import CommTimeoutError
from deepspeed.comm.groups import (
    ReduceOp,
    destroy_process_group,
    get_all_ranks_from_group,
    get_backend,
    get_global_rank,
    get_local_rank,
    get_rank,
    get_world_group,
    get_world_size,
    is_available,
    is_initialized,
    new_group,
)
from deepspeed.comm.initialization import init_distributed
from deepspeed.comm.observers import (
    CommRecord,
    CommsLoggerSettings,
    add_comm_observer,
    comm_observers,
    comms_logger_settings,
    configure,
    configured_comms_logger,
    log_summary,
    remove_comm_observer,
)
from deepspeed.utils import logging as _logging

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
    logs through it), so the dependency points from here down to it.
    """
    return get_rank() if is_initialized() else None


_logging.set_rank_source(_rank_for_logs)

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
