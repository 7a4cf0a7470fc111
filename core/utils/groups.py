"""Which ranks a tensor is shared or split across, for each kind of parallelism
(`deepspeed.utils.groups`).

Integrations ask these questions by the upstream names (Accelerate and Transformers call
``groups._get_sequence_parallel_group()`` and friends), so the names keep their leading
underscores. The answers come from one registered *model-parallel unit* (``mpu``): any object
following Megatron's convention (``get_data_parallel_group()``,
``get_model_parallel_world_size()``, ``get_sequence_parallel_group()``, ...). The engine
registers the ``mpu`` passed to ``deepspeed.initialize``; a parallelism feature (sequence
parallelism, tensor parallelism) registers its own when it builds its groups: AutoTP training's
tensor x data parallel groups are built here (``init_tensor_parallel_groups``,
``TensorParallelGroups``). Without one, every
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


# ---------------------------------------------------------------- tensor x data parallel
class TensorParallelGroups:
    """A model-parallel unit for AutoTP training: ``tp_size`` consecutive ranks share one
    model split by tensor parallelism, the ranks with the same tensor-parallel rank form the
    data-parallel groups (the Megatron layout, the one Accelerate's ``tp`` device mesh assumes
    when it gives every rank of a tensor-parallel group the same batches): ``rank = dp_rank *
    tp_size + tp_rank``. TP 2 x DP 2: tensor-parallel groups [0, 1], [2, 3]; data-parallel
    [0, 2], [1, 3].

    Building it is collective (every rank creates every group, in the same order). It answers
    the Megatron getters (``get_tensor_model_parallel_group()`` / ``get_model_parallel_*`` and
    ``get_data_parallel_*``), so it is what ``deepspeed.initialize(mpu=...)``, the engine and
    ``deepspeed.utils.groups`` read; ``init_tensor_parallel_groups`` registers it. Features
    that overlap tensor-parallel communication (Domino) take their groups from here."""

    def __init__(self, tp_size):
        if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
            raise ValueError(f"tensor parallel size must be a positive int, got {tp_size!r}")
        if not dist.is_initialized():
            raise RuntimeError(f"tensor parallelism (tp_size={tp_size}) needs the distributed "
                               f"backend: call deepspeed.init_distributed() first")
        world, rank = dist.get_world_size(), dist.get_rank()
        if world % tp_size:
            raise ValueError(f"tensor parallel size {tp_size} does not divide the world size "
                             f"{world}; use a tp_size that divides it (the other factor is the "
                             f"data-parallel size)")
        self.tp_size, self.dp_size = tp_size, world // tp_size
        self.tp_rank, self.dp_rank = rank % tp_size, rank // tp_size
        self.world = dist.get_world_group()
        self.tp_ranks = self.dp_ranks = None
        self.tp_group = self.dp_group = None
        for first in range(0, world, tp_size):
            ranks = list(range(first, first + tp_size))
            group = dist.new_group(ranks)
            if rank in ranks:
                self.tp_group, self.tp_ranks = group, ranks
        for tp_rank in range(tp_size):
            ranks = list(range(tp_rank, world, tp_size))
            group = dist.new_group(ranks)
            if rank in ranks:
                self.dp_group, self.dp_ranks = group, ranks

    def get_tensor_model_parallel_group(self):
        return self.tp_group

    def get_tensor_model_parallel_world_size(self):
        return self.tp_size

    def get_tensor_model_parallel_rank(self):
        return self.tp_rank

    def get_tensor_model_parallel_src_rank(self):
        """Global rank of the first member of this rank's tensor-parallel group."""
        return self.tp_ranks[0]

    get_model_parallel_group = get_tensor_model_parallel_group
    get_model_parallel_world_size = get_tensor_model_parallel_world_size
    get_model_parallel_rank = get_tensor_model_parallel_rank

    def get_data_parallel_group(self):
        return self.dp_group

    def get_data_parallel_world_size(self):
        return self.dp_size

    def get_data_parallel_rank(self):
        return self.dp_rank


def init_tensor_parallel_groups(tensor_model_parallel_size):
    """Build the tensor x data parallel groups for ``tensor_model_parallel_size`` and register
    them as the model-parallel unit these getters answer from; returns the
    ``TensorParallelGroups``. Collective. The same size again, in the same world, returns the
    registered unit without building new groups."""
    current = mpu
    if (isinstance(current, TensorParallelGroups) and current.world is dist.get_world_group()
            and current.tp_size == tensor_model_parallel_size):
        return current
    unit = TensorParallelGroups(tensor_model_parallel_size)
    set_mpu(unit)
    return unit


def _init_tp_mesh_device(tensor_model_parallel_size=1, data_parallel_size=None):
    """Upstream's spelling of ``init_tensor_parallel_groups``; ``data_parallel_size``, when
    given, must be the world size divided by ``tensor_model_parallel_size``."""
    unit = init_tensor_parallel_groups(tensor_model_parallel_size)
    if data_parallel_size is not None and data_parallel_size != unit.dp_size:
        raise ValueError(f"data_parallel_size={data_parallel_size} does not match the world "
                         f"size {dist.get_world_size()} / tensor_model_parallel_size "
                         f"{tensor_model_parallel_size} = {unit.dp_size}")
    return unit


def get_tensor_model_parallel_src_rank():
    """Global rank of the first member of this rank's tensor-parallel group (the rank whose
    batch the others of the group would receive)."""
    return dist.get_global_rank(_get_model_parallel_group(), 0)


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
# With tensor parallelism (an mpu whose model-parallel size is > 1) two more per name: the
# expert-data-parallel groups of every tensor-parallel rank joined (the ranks holding a copy
# of the same experts when the experts are *not* tensor parallel: their gradients are summed
# there), and the expert-parallel groups of every tensor-parallel rank joined (the ranks
# holding other experts or other tensor-parallel pieces of them: a gradient norm sums there).
_EXPERT_REPLICA_GROUP = {}
_EXPERT_MODEL_PARALLEL_GROUP = {}
_EXPERT_GROUPS_MPU = {}  # name -> the mpu the groups were built under (another one rebuilds)
_EXPERT_GROUPS_WORLD = None  # the world the groups above were built in (a re-init drops them)
_EXPERT_TABLES = (_EXPERT_PARALLEL_GROUP, _EXPERT_DATA_PARALLEL_GROUP, _EXPERT_REPLICA_GROUP,
                  _EXPERT_MODEL_PARALLEL_GROUP, _EXPERT_GROUPS_MPU)


def _expert_group_name(expert_parallel_size):
    return f"ep_size_{expert_parallel_size}"


def _forget_stale_expert_groups():
    """Groups of a destroyed-and-reinitialised world are dead handles: start afresh."""
    global _EXPERT_GROUPS_WORLD
    world = dist.get_world_group()
    if _EXPERT_GROUPS_WORLD is not world:
        for table in _EXPERT_TABLES:
            table.clear()
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


def _data_parallel_rank_lists():
    """Every data-parallel group of the run as its global ranks in data-parallel-rank order,
    ordered by their first rank: ``[range(world)]`` without model parallelism, else one per
    model-parallel slice (tensor x pipeline rank). The registered mpu only knows this rank's
    group, so the lists are gathered (collective over the world)."""
    world = dist.get_world_size()
    dp_size = _get_data_parallel_world_size()
    if dp_size == world:
        return [list(range(world))]
    group = _get_data_parallel_group()
    mine = [int(dist.get_global_rank(group, i)) for i in range(dp_size)]
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    lists = sorted({tuple(ranks) for ranks in gathered}, key=lambda ranks: ranks[0])
    covered = sorted(rank for ranks in lists for rank in ranks)
    if covered != list(range(world)) or any(len(ranks) != dp_size for ranks in lists):
        raise RuntimeError(f"the registered mpu's data-parallel groups {lists} do not split the "
                           f"{world} ranks into groups of its data-parallel size {dp_size}")
    return [list(ranks) for ranks in lists]


def _new_groups(rank_lists, table, name, rank):
    """One ``new_group`` per list (every rank, same order); keep the one holding ``rank``."""
    for ranks in rank_lists:
        group = dist.new_group(ranks)
        if rank in ranks:
            table[name] = group


def _create_expert_and_data_parallel(expert_parallel_size_, use_data_before_expert_parallel_=False):
    """Build (once per size and registered mpu) the expert-parallel and expert-data-parallel
    groups for ``expert_parallel_size_``. Collective: every rank must call it, in the same
    order, since each ``new_group`` is.

    The experts are laid out over the data-parallel ranks of each model-parallel slice, the
    layout Megatron-DeepSpeed uses: the slice's data-parallel ranks (in data-parallel-rank
    order) are cut into expert-parallel groups of ``ep_size``, the expert-data-parallel groups
    are the strided complement. Tensor parallel 2 x data parallel 4 (ranks ``dp * 2 + tp``),
    ep 2: data-parallel groups [0, 2, 4, 6] and [1, 3, 5, 7], expert-parallel [0, 2], [4, 6],
    [1, 3], [5, 7], expert-data-parallel [0, 4], [2, 6], [1, 5], [3, 7]."""
    if not dist.is_initialized():
        raise RuntimeError(f"expert parallelism (ep_size={expert_parallel_size_}) needs the "
                           f"distributed backend: call deepspeed.init_distributed() first")
    _forget_stale_expert_groups()
    name = _expert_group_name(expert_parallel_size_)
    if name in _EXPERT_PARALLEL_GROUP and _EXPERT_GROUPS_MPU.get(name) is mpu:
        return
    sequence = _get_sequence_parallel_world_size()
    if sequence != 1:
        raise NotImplementedError(
            f"MoE expert groups (ep_size={expert_parallel_size_}) together with sequence "
            f"parallelism (sequence_parallel_size={sequence}) are not supported: each sequence-"
            f"parallel rank holds other tokens of the same samples, so the experts would have "
            f"to be laid out over the sequence-data-parallel ranks and their gradients reduced "
            f"there, which this implementation does not do; use ep_size=1 (experts replicated "
            f"like dense weights) or sequence_parallel_size=1")
    for table in _EXPERT_TABLES:
        table.pop(name, None)
    rank = dist.get_rank()
    data_lists = _data_parallel_rank_lists()
    # per model-parallel slice: the layout over its data-parallel ranks, in global ranks
    per_slice = []
    for ranks in data_lists:
        expert_idx, data_idx = _expert_layout(len(ranks), expert_parallel_size_,
                                              use_data_before_expert_parallel_)
        per_slice.append(([[ranks[i] for i in ids] for ids in expert_idx],
                          [[ranks[i] for i in ids] for ids in data_idx]))
    _new_groups([g for _, edp in per_slice for g in edp], _EXPERT_DATA_PARALLEL_GROUP, name, rank)
    _new_groups([g for ep, _ in per_slice for g in ep], _EXPERT_PARALLEL_GROUP, name, rank)
    if _get_model_parallel_world_size() > 1:
        # the same position's groups of every slice, joined
        for table, which in ((_EXPERT_REPLICA_GROUP, 1), (_EXPERT_MODEL_PARALLEL_GROUP, 0)):
            joined = [sorted(r for layout in per_slice for r in layout[which][position])
                      for position in range(len(per_slice[0][which]))]
            _new_groups(joined, table, name, rank)
    _EXPERT_GROUPS_MPU[name] = mpu


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


def _get_expert_replica_group(group_name):
    """The ranks holding a copy of this rank's experts when the experts are replicated across
    the tensor-parallel ranks (not tensor parallel): the expert-data-parallel group of every
    tensor-parallel rank joined. Without tensor parallelism, the expert-data-parallel group."""
    if dist.is_initialized():
        _forget_stale_expert_groups()
    group = _EXPERT_REPLICA_GROUP.get(group_name)
    return group if group is not None else _get_expert_data_parallel_group(group_name)


def _get_expert_model_parallel_group(group_name):
    """The ranks holding the other experts or the other tensor-parallel pieces of this rank's
    (tensor-parallel experts): the expert-parallel group of every tensor-parallel rank
    joined. Without tensor parallelism, the expert-parallel group."""
    if dist.is_initialized():
        _forget_stale_expert_groups()
    group = _EXPERT_MODEL_PARALLEL_GROUP.get(group_name)
    return group if group is not None else _get_expert_parallel_group(group_name)


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
