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


# ---------------------------------------------------------------- expert parallel
# Mixture-of-experts layers split their experts over an *expert-parallel* group of ``ep_size``
# ranks; the ranks holding the same experts form the *expert-data-parallel* group, over which
# those experts' gradients are averaged. Layers with different ``ep_size`` coexist, so the
# groups are kept per name, ``ep_size_{n}`` (upstream's key, which checkpoints and Megatron-
# DeepSpeed use too).
_EXPERT_PARALLEL_GROUP = {}
_EXPERT_DATA_PARALLEL_GROUP = {}
_EXPERT_GROUPS_WORLD = None  # the world the groups above were built in (a re-init drops them)


def _expert_group_name(expert_parallel_size):
    return f"ep_size_{expert_parallel_size}"


def _forget_stale_expert_groups():
    """Groups of a destroyed-and-reinitialised world are dead handles: start afresh."""
    global _EXPERT_GROUPS_WORLD
    world = dist.get_world_group()
    if _EXPERT_GROUPS_WORLD is not world:
        _EXPERT_PARALLEL_GROUP.clear()
        _EXPERT_DATA_PARALLEL_GROUP.clear()
        _EXPERT_GROUPS_WORLD = world


def _expert_layout(world_size, expert_parallel_size, use_data_before_expert_parallel_=False):
    """``(expert_parallel_rank_lists, expert_data_parallel_rank_lists)`` for ``world_size``
    data-parallel ranks. By default the expert-parallel groups are contiguous ranks ([0, 1],
    [2, 3] for ep 2 of 4) and the expert-data-parallel groups strided ([0, 2], [1, 3]);
    ``use_data_before_expert_parallel_`` swaps the two, as upstream does."""
    if not isinstance(expert_parallel_size, int) or expert_parallel_size < 1:
        raise ValueError(f"expert parallel size must be a positive int, got "
                         f"{expert_parallel_size!r}")
    if world_size % expert_parallel_size != 0:
        raise ValueError(f"expert parallel size {expert_parallel_size} must divide the "
                         f"data-parallel world size {world_size}")
    ep, replicas = expert_parallel_size, world_size // expert_parallel_size
    contiguous = [list(range(i * ep, (i + 1) * ep)) for i in range(replicas)]
    strided = [list(range(i, world_size, ep)) for i in range(ep)]
    if use_data_before_expert_parallel_:
        contiguous = [list(range(i * replicas, (i + 1) * replicas)) for i in range(ep)]
        strided = [list(range(i, world_size, replicas)) for i in range(replicas)]
        return strided, contiguous
    return contiguous, strided


def _create_expert_and_data_parallel(expert_parallel_size_, use_data_before_expert_parallel_=False):
    """Build (once per size) the expert-parallel and expert-data-parallel groups for
    ``expert_parallel_size_``. Collective: every rank must call it, in the same order, since
    each ``new_group`` is. Only pure data parallelism is supported so far: with model or
    sequence parallelism the experts would have to be laid out over the data-parallel ranks of
    each model-parallel slice."""
    if not dist.is_initialized():
        raise RuntimeError(f"expert parallelism (ep_size={expert_parallel_size_}) needs the "
                           f"distributed backend: call deepspeed.init_distributed() first")
    _forget_stale_expert_groups()
    name = _expert_group_name(expert_parallel_size_)
    if name in _EXPERT_PARALLEL_GROUP:
        return
    for kind, size in (("model", _get_model_parallel_world_size()),
                       ("sequence", _get_sequence_parallel_world_size())):
        if size != 1:
            raise NotImplementedError(f"expert parallelism together with {kind} parallelism "
                                      f"(size {size}) is not supported yet; ep_size="
                                      f"{expert_parallel_size_}")
    world, rank = dist.get_world_size(), dist.get_rank()
    expert_lists, data_lists = _expert_layout(world, expert_parallel_size_,
                                              use_data_before_expert_parallel_)
    for ranks in data_lists:
        group = dist.new_group(ranks)
        if rank in ranks:
            _EXPERT_DATA_PARALLEL_GROUP[name] = group
    for ranks in expert_lists:
        group = dist.new_group(ranks)
        if rank in ranks:
            _EXPERT_PARALLEL_GROUP[name] = group


def _expert_group(table, kind, group_name):
    if dist.is_initialized():
        _forget_stale_expert_groups()
    if group_name not in table:
        raise RuntimeError(f"no {kind} group named {group_name!r} exists (built: "
                           f"{sorted(table) or 'none'}); an MoE layer builds its groups, or call "
                           f"deepspeed.utils.groups._create_expert_and_data_parallel(ep_size)")
    return table[group_name]


def _get_expert_parallel_group(group_name):
    """The ranks that split the experts of the MoE layers with this group name."""
    return _expert_group(_EXPERT_PARALLEL_GROUP, "expert-parallel", group_name)


def _get_expert_parallel_group_dict():
    if dist.is_initialized():
        _forget_stale_expert_groups()
    return _EXPERT_PARALLEL_GROUP


def _get_expert_data_parallel_group(group_name):
    """The ranks that hold the same experts: their gradients are averaged over it."""
    return _expert_group(_EXPERT_DATA_PARALLEL_GROUP, "expert-data-parallel", group_name)


def _get_expert_data_parallel_group_dict():
    if dist.is_initialized():
        _forget_stale_expert_groups()
    return _EXPERT_DATA_PARALLEL_GROUP


def _get_expert_parallel_world_size(group_name):
    return dist.get_world_size(group=_get_expert_parallel_group(group_name))


def _get_expert_parallel_rank(group_name):
    return dist.get_rank(group=_get_expert_parallel_group(group_name))


def _get_expert_parallel_src_rank(group_name):
    """Global rank of the first member of this rank's expert-parallel group."""
    return dist.get_global_rank(_get_expert_parallel_group(group_name), 0)


def _get_expert_data_parallel_world_size(group_name):
    return dist.get_world_size(group=_get_expert_data_parallel_group(group_name))


def _get_expert_data_parallel_rank(group_name):
    return dist.get_rank(group=_get_expert_data_parallel_group(group_name))


def _get_expert_data_parallel_src_rank(group_name):
    return dist.get_global_rank(_get_expert_data_parallel_group(group_name), 0)


def _get_max_expert_size():
    """The largest expert-parallel size built so far (None when none was)."""
    sizes = [int(name[len("ep_size_"):]) for name in _get_expert_parallel_group_dict()]
    return max(sizes) if sizes else None


def _get_max_expert_size_name():
    size = _get_max_expert_size()
    return None if size is None else _expert_group_name(size)


def _get_max_expert_parallel_group():
    return _get_expert_parallel_group(_get_max_expert_size_name())


def initialize(ep_size=1, mpu=None):
    """Deprecated upstream entry point (the MoE tutorial's first snippet): registers ``mpu``
    and builds the expert groups for ``ep_size``. MoE layers now build their own groups from
    their ``ep_size`` argument."""
    from deepspeed.utils.logging import logger

    logger.warning("deepspeed.utils.groups.initialize is deprecated: pass ep_size to "
                   "deepspeed.moe.layer.MoE, which builds its process groups itself")
    if mpu is not None:
        set_mpu(mpu)
    _create_expert_and_data_parallel(ep_size)
