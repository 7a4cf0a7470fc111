"""What the ranks must agree on while saving: the tag, who writes which file, and success.

Saving is collective. If one rank fails (disk full, a state that cannot be stored) while the
others wait in a barrier, the job hangs; so each phase ends with a small all-reduce of "did I
fail?" flags, and every rank raises when any rank failed. That all-reduce also serves as the
barrier that keeps ``latest`` from naming a checkpoint some rank has not finished writing.
"""
import hashlib

import torch

from deepspeed import comm as dist
from deepspeed.utils.logging import logger


class CheckpointTagMismatchError(AssertionError):
    """``checkpoint.tag_validation: Fail`` and the ranks passed different tags. (An
    AssertionError because DeepSpeed asserts here; code catching that keeps working.)"""


class CheckpointWriteError(RuntimeError):
    """Another rank failed during a collective checkpoint operation."""


def _device(engine):
    return getattr(engine, "device", None) or torch.device("cpu")


def _world_rank():
    return dist.get_rank()


def local_rank(engine):
    value = getattr(engine, "local_rank", None)
    return int(value) if value is not None else dist.get_local_rank()


def model_parallel_rank(engine):
    mpu = getattr(engine, "mpu", None)
    return mpu.get_model_parallel_rank() if mpu is not None else 0


def model_parallel_world_size(engine):
    mpu = getattr(engine, "mpu", None)
    return mpu.get_model_parallel_world_size() if mpu is not None else 1


def data_parallel_rank(engine):
    return dist.get_rank(group=getattr(engine, "dp_group", None))


def _node_local_storage(engine):
    return bool(getattr(engine.config, "use_node_local_storage", False))


def writes_model_states(engine):
    """Whether this rank writes ``mp_rank_XX_model_states.pt``: data-parallel rank 0 of its
    model-parallel slice on shared storage; with ``checkpoint.use_node_local_storage`` the
    first rank of each node holding that slice (every node needs its own copy). Collective
    when model parallelism and node-local storage are combined."""
    if not _node_local_storage(engine):
        return data_parallel_rank(engine) == 0
    if model_parallel_world_size(engine) == 1:
        return local_rank(engine) == 0
    rank = _world_rank()
    me = (rank - local_rank(engine), model_parallel_rank(engine))  # (node's first rank, mp rank)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (me, rank))
    return min(r for key, r in everyone if key == me) == rank


def writes_shared_files(engine):
    """Whether this rank writes files that exist once per storage (``latest``, the 16-bit
    model): global rank 0, or each node's local rank 0 with node-local storage."""
    if _node_local_storage(engine):
        return local_rank(engine) == 0
    return _world_rank() == 0


def validate_tag(engine, tag):
    """Compare ``tag`` across all ranks (SHA1 digest, one MAX all-reduce of digest and its
    negation = max and min); ``checkpoint.tag_validation`` says whether a mismatch is ignored
    (the check is skipped), logged, or fatal on every rank."""
    config = engine.config
    if not config.checkpoint_tag_validation_enabled:
        return
    digest = torch.tensor(list(hashlib.sha1(tag.encode("utf-8")).digest()), dtype=torch.int64,
                          device=_device(engine))
    both = torch.cat([digest, -digest])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    if torch.equal(both[:digest.numel()], -both[digest.numel():]):
        return
    message = (f"checkpoint tag '{tag}' on rank {_world_rank()} differs from the tag of at least "
               f"one other rank; all ranks must save under the same tag "
               f"(checkpoint.tag_validation is '{config.core.checkpoint.tag_validation}')")
    if config.checkpoint_tag_validation_fail:
        raise CheckpointTagMismatchError(message)
    logger.warning(message)


def failed_ranks(engine, failed):
    """Every rank's ``failed`` flag, gathered with one all-reduce: the sorted failing ranks."""
    flags = torch.zeros(dist.get_world_size(), dtype=torch.int32, device=_device(engine))
    flags[_world_rank()] = int(bool(failed))
    dist.all_reduce(flags)
    return [rank for rank, flag in enumerate(flags.tolist()) if flag]


def on_all_ranks(engine, what, fn):
    """Run ``fn`` on this rank, then raise on every rank if it failed on any. The failing rank
    re-raises its own exception (type kept); the others raise ``CheckpointWriteError``."""
    error, result = None, None
    try:
        result = fn()
    except Exception as exc:  # re-raised below, after the other ranks were told
        error = exc
    failed = failed_ranks(engine, error is not None)
    if error is not None:
        if hasattr(error, "add_note"):
            error.add_note(f"{what} failed on rank(s) {failed}")
        raise error
    if failed:
        raise CheckpointWriteError(f"{what} failed on rank(s) {failed}; that rank's log has the "
                                   f"error")
    return result
