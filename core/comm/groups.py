"""Process-group queries and management: rank, world size, backend, subgroups, tear-down."""
import os
from datetime import timedelta
from typing import Optional

import torch.distributed as dist

from deepspeed.comm import capabilities, state

ReduceOp = dist.ReduceOp


def is_available() -> bool:
    return dist.is_available()


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def _require_initialized(name):
    if not is_initialized():
        raise RuntimeError(f"deepspeed.comm.{name}() needs an initialised process group: call "
                           "deepspeed.init_distributed() (or deepspeed.initialize()) first")


def get_rank(group=None) -> int:
    _require_initialized("get_rank")
    return dist.get_rank(group)


def get_world_size(group=None) -> int:
    _require_initialized("get_world_size")
    return dist.get_world_size(group)


def get_local_rank() -> int:
    """This process's index on its node, from LOCAL_RANK (set by every launcher we support)."""
    value = os.environ.get("LOCAL_RANK")
    if value not in (None, ""):
        try:
            return int(value)
        except ValueError:
            raise RuntimeError(f"LOCAL_RANK={value!r} is not an integer") from None
    if is_initialized() and dist.get_world_size() == 1:
        return 0
    raise RuntimeError("LOCAL_RANK is not set: start the job with the deepspeed launcher, torchrun "
                       "or a launcher init_distributed() understands (Open MPI, MPICH, MVAPICH, "
                       "SLURM), or export LOCAL_RANK")


def get_global_rank(group, group_rank: int) -> int:
    _require_initialized("get_global_rank")
    if group is None or group is dist.group.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


def get_all_ranks_from_group(group=None):
    _require_initialized("get_all_ranks_from_group")
    return dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)


def get_world_group():
    _require_initialized("get_world_group")
    return dist.group.WORLD


def get_backend(group=None) -> str:
    _require_initialized("get_backend")
    return str(dist.get_backend(group))


def new_group(ranks=None, timeout: Optional[timedelta] = None, backend=None, pg_options=None,
              **kwargs):
    """A subgroup (collective: every rank calls it). Without `timeout` it inherits the one given
    to init_distributed, where torch would silently use its own 30-minute default."""
    _require_initialized("new_group")
    if timeout is not None and not isinstance(timeout, timedelta):
        raise TypeError(f"new_group(timeout=...) must be a datetime.timedelta, got {timeout!r}")
    effective = timeout if timeout is not None else state.default_timeout()
    if effective is not None:
        kwargs["timeout"] = effective
    group = dist.new_group(ranks=ranks, backend=backend, pg_options=pg_options, **kwargs)
    if isinstance(group, dist.ProcessGroup):  # ranks outside `ranks` get a placeholder
        state.set_group_timeout(group, effective)
    return group


def destroy_process_group(group=None) -> None:
    """Destroy `group`, or with None the default group and every subgroup (as torch does)."""
    if not is_initialized():
        return
    dist.destroy_process_group(group)
    if group is None or group is dist.group.WORLD:
        state.reset()
        capabilities.reset()
    else:
        state.forget_group(group)
