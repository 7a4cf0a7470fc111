"""Which ranks a tensor is shared or split across, for each kind of parallelism
(`deepspeed.utils.groups`).

Integrations ask these questions by the upstream names (Accelerate and Transformers call
``groups._get_sequence_parallel_group()`` and friends), so the names keep their leading
underscores. The answers come from one registered *model-parallel unit* (``mpu``): any object
following Megatron's convention (``get_data_parallel_group()``,
``get_model_parallel_world_size()``, ``get_sequence_parallel_group()``, ...). The engine
registers the ``mpu`` passed to ``deepspeed.initialize``; a parallelism feature (sequence
parallelism, tensor parallelism) registers its own when it builds its groups. Without one, every
rank is pure data parallel: the data-parallel group is the world, and model / sequence parallel
sizes are 1.

A group that does not exist is an error, never ``None``: ``None`` means "the world" to
``torch.distributed``, and a collective silently run over the world instead of a sub-group gives
wrong numbers rather than a failure.
"""
from deepspeed import comm as dist

mpu = None


def set_mpu(unit):
    """Register the model-parallel unit whose groups the getters below report (``None`` clears
    it). Returns the previous one so a caller can restore it."""
    global mpu
    previous, mpu = mpu, unit
    return previous


def _mpu_answer(method):
    """``mpu.<method>()`` when a unit is registered and provides it, else ``None``."""
    fn = getattr(mpu, method, None) if mpu is not None else None
    return fn() if fn is not None else None


def _missing_group(kind, size_key):
    return RuntimeError(
        f"no {kind} group exists: {kind} is not configured in this run ({size_key} is 1). "
        f"Register a model-parallel unit that provides it with deepspeed.initialize(mpu=...) or "
        f"deepspeed.utils.groups.set_mpu(...)")


# ---------------------------------------------------------------- data parallel
def _get_data_parallel_group():
    """The ranks that hold replicas (or ZeRO shards) of the same parameters."""
    group = _mpu_answer("get_data_parallel_group")
    return group if group is not None else dist.get_world_group()


def _get_data_parallel_world_size():
    size = _mpu_answer("get_data_parallel_world_size")
    return size if size is not None else dist.get_world_size(group=_get_data_parallel_group())


def _get_data_parallel_rank():
    rank = _mpu_answer("get_data_parallel_rank")
    return rank if rank is not None else dist.get_rank(group=_get_data_parallel_group())


def _get_broadcast_src_rank():
    """Global rank of the first member of this rank's data-parallel group."""
    return dist.get_global_rank(_get_data_parallel_group(), 0)


# ---------------------------------------------------------------- model (tensor) parallel
def _get_model_parallel_group():
    group = (_mpu_answer("get_model_parallel_group")
             or _mpu_answer("get_tensor_model_parallel_group"))
    if group is None:
        raise _missing_group("model parallelism", "the model-parallel world size")
    return group


def _get_model_parallel_world_size():
    for method in ("get_model_parallel_world_size", "get_tensor_model_parallel_world_size"):
        size = _mpu_answer(method)
        if size is not None:
            return size
    return 1


def _get_model_parallel_rank():
    for method in ("get_model_parallel_rank", "get_tensor_model_parallel_rank"):
        rank = _mpu_answer(method)
        if rank is not None:
            return rank
    return 0


get_tensor_model_parallel_group = _get_model_parallel_group
get_tensor_model_parallel_world_size = _get_model_parallel_world_size
get_tensor_model_parallel_rank = _get_model_parallel_rank


# ---------------------------------------------------------------- sequence parallel
def _get_sequence_parallel_group():
    """The ranks that each hold a slice of the same sequences (Ulysses)."""
    group = _mpu_answer("get_sequence_parallel_group")
    if group is None:
        raise _missing_group("sequence parallelism", "sequence_parallel_size")
    return group


def _get_sequence_parallel_world_size():
    size = _mpu_answer("get_sequence_parallel_world_size")
    return size if size is not None else 1


def _get_sequence_parallel_rank():
    rank = _mpu_answer("get_sequence_parallel_rank")
    return rank if rank is not None else 0


def _get_sequence_data_parallel_group():
    """Sequence x data parallel ranks: the group gradients are averaged over when sequence
    parallelism splits a sample across ranks. Without sequence parallelism it is the
    data-parallel group."""
    group = _mpu_answer("get_sequence_data_parallel_group")
    return group if group is not None else _get_data_parallel_group()


def _get_sequence_data_parallel_world_size():
    size = _mpu_answer("get_sequence_data_parallel_world_size")
    return size if size is not None else dist.get_world_size(
        group=_get_sequence_data_parallel_group())


def _get_sequence_data_parallel_rank():
    rank = _mpu_answer("get_sequence_data_parallel_rank")
    return rank if rank is not None else dist.get_rank(group=_get_sequence_data_parallel_group())
