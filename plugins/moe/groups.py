"""The expert dimensions of the topology, and upstream's names for them in
``deepspeed.utils.groups`` (``_get_expert_parallel_group(name)``, ``initialize(ep_size, mpu)``,
...; registered under the entry-point group ``deepspeed.exports.utils.groups``).

Mixture-of-experts layers split their experts over an *expert-parallel* group of ``ep_size``
ranks; the ranks holding the same experts form the *expert-data-parallel* group, over which those
experts' gradients are averaged. Layers with different ``ep_size`` coexist, so each dimension
exists once per group name, ``ep_size_{n}`` (upstream's key, which checkpoints and
Megatron-DeepSpeed use too): ``topology.group("expert", "ep_size_2")``. With tensor parallelism
(a unit whose model-parallel size is > 1) two more per name: ``"expert_replica"``, the
expert-data-parallel groups of every tensor-parallel rank joined (the ranks holding a copy of the
same experts when the experts are *not* tensor parallel: their gradients are summed there), and
``"expert_model"``, the expert-parallel groups of every tensor-parallel rank joined (the ranks
holding other experts or other tensor-parallel pieces of them: a gradient norm sums there).

These are plain ``ParallelDim``s, not a ``DeviceMesh``: several layouts exist at once, each
cutting the data-parallel ranks of every model-parallel slice, which a mesh over the world cannot
express. Each records the unit it was laid out under (``basis``); under another unit (an engine
given a different ``mpu`` than the one the model was built under) it is laid out again.
"""
from collections.abc import MutableMapping

from deepspeed import comm as dist
from deepspeed import topology
from deepspeed.hooks import ParallelDim

EXPERT, EXPERT_DATA = "expert", "expert_data"
EXPERT_REPLICA, EXPERT_MODEL = "expert_replica", "expert_model"
_KINDS = {EXPERT: "expert-parallel", EXPERT_DATA: "expert-data-parallel",
          EXPERT_REPLICA: "expert-replica", EXPERT_MODEL: "expert-model-parallel"}


def tensor_dim(topo=None):
    """The topology dimension of the tensor-parallel ranks the experts are replicated over:
    the unit's tensor-slicing group where it names one (``get_tensor_model_parallel_group``:
    a pipeline grid, whose "model" groups also span its stages; a Megatron ``mpu``), else
    "model"."""
    topo = topo or topology.current()
    unit = topo.unit
    return "tensor_model" if unit is not None and callable(
        getattr(unit, "get_tensor_model_parallel_group", None)) else "model"


def _expert_group_name(expert_parallel_size):
    return f"ep_size_{expert_parallel_size}"


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


def expert_dims(expert_parallel_size, use_data_before_expert_parallel_=False, topo=None):
    """The ``ParallelDim``s of one expert-parallel size, laid out the way Megatron-DeepSpeed
    does over the data-parallel ranks of each model-parallel slice: the slice's data-parallel
    ranks (in data-parallel-rank order) are cut into expert-parallel groups of ``ep_size``, the
    expert-data-parallel groups are the strided complement. Tensor parallel 2 x data parallel 4
    (ranks ``dp * 2 + tp``), ep 2: data-parallel groups [0, 2, 4, 6] and [1, 3, 5, 7],
    expert-parallel [0, 2], [4, 6], [1, 3], [5, 7], expert-data-parallel [0, 4], [2, 6], [1, 5],
    [3, 7]. Collective when the unit only knows this rank's data-parallel group."""
    topo = topo or topology.current()
    name = _expert_group_name(expert_parallel_size)
    per_slice = []  # per model-parallel slice: the layout over its data ranks, in global ranks
    for ranks in topo.rank_lists("data"):
        expert_idx, data_idx = _expert_layout(len(ranks), expert_parallel_size,
                                              use_data_before_expert_parallel_)
        per_slice.append(([[ranks[i] for i in ids] for ids in expert_idx],
                          [[ranks[i] for i in ids] for ids in data_idx]))
    basis = topo.unit
    dims = [ParallelDim(EXPERT_DATA, tuple(map(tuple, (g for _, edp in per_slice for g in edp))),
                        name, basis),
            ParallelDim(EXPERT, tuple(map(tuple, (g for ep, _ in per_slice for g in ep))), name,
                        basis)]
    if topo.size(tensor_dim(topo)) > 1:  # the same position's groups of every slice, joined
        for dim_name, which in ((EXPERT_REPLICA, 1), (EXPERT_MODEL, 0)):
            joined = tuple(tuple(sorted(r for layout in per_slice for r in layout[which][position]))
                           for position in range(len(per_slice[0][which])))
            dims.append(ParallelDim(dim_name, joined, name, basis))
    return dims


def ensure_expert_groups(expert_parallel_size, use_data_before_expert_parallel_=False):
    """The expert-parallel ``Dimension`` of ``expert_parallel_size`` in the current topology,
    built (collectively: every rank must call this, in the same order) unless it exists for
    the current unit."""
    if not dist.is_initialized():
        raise RuntimeError(f"expert parallelism (ep_size={expert_parallel_size}) needs the "
                           f"distributed backend: call deepspeed.init_distributed() first")
    topo = topology.current()
    name = _expert_group_name(expert_parallel_size)
    existing = topo.built(EXPERT, name)
    if existing is not None and existing.basis is topo.unit:
        return existing
    sequence = topo.size("sequence")
    if sequence != 1:
        raise NotImplementedError(
            f"MoE expert groups (ep_size={expert_parallel_size}) together with sequence "
            f"parallelism (sequence_parallel_size={sequence}) are not supported: each sequence-"
            f"parallel rank holds other tokens of the same samples, so the experts would have "
            f"to be laid out over the sequence-data-parallel ranks and their gradients reduced "
            f"there, which this implementation does not do; use ep_size=1 (experts replicated "
            f"like dense weights) or sequence_parallel_size=1")
    for dim_name in _KINDS:
        topo.remove(dim_name, name)
    topo.add(*expert_dims(expert_parallel_size, use_data_before_expert_parallel_, topo))
    return topo.built(EXPERT, name)


# ---------------------------------------------------------------- upstream's names
def _create_expert_and_data_parallel(expert_parallel_size_, use_data_before_expert_parallel_=False):
    """Build (once per size and unit) the expert-parallel and expert-data-parallel groups for
    ``expert_parallel_size_`` (see ``expert_dims``). Collective."""
    ensure_expert_groups(expert_parallel_size_, use_data_before_expert_parallel_)


def _expert_group(dim_name, group_name):
    topo = topology.current()
    if topo.built(dim_name, group_name) is None:
        raise RuntimeError(f"no {_KINDS[dim_name]} group named {group_name!r} exists (built: "
                           f"{topo.keys(dim_name) or 'none'}); an MoE layer builds its groups, or "
                           f"call deepspeed.utils.groups._create_expert_and_data_parallel(ep_size)")
    return topo.group(dim_name, group_name)


def _get_expert_parallel_group(group_name):
    """The ranks that split the experts of the MoE layers with this group name."""
    return _expert_group(EXPERT, group_name)


def _get_expert_data_parallel_group(group_name):
    """The ranks that hold the same experts: their gradients are averaged over it."""
    return _expert_group(EXPERT_DATA, group_name)


def _get_expert_replica_group(group_name):
    """The ranks holding a copy of this rank's experts when the experts are replicated across
    the tensor-parallel ranks (not tensor parallel): the expert-data-parallel group of every
    tensor-parallel rank joined. Without tensor parallelism, the expert-data-parallel group."""
    if topology.current().built(EXPERT_REPLICA, group_name) is not None:
        return _expert_group(EXPERT_REPLICA, group_name)
    return _get_expert_data_parallel_group(group_name)


def _get_expert_model_parallel_group(group_name):
    """The ranks holding the other experts or the other tensor-parallel pieces of this rank's
    (tensor-parallel experts): the expert-parallel group of every tensor-parallel rank
    joined. Without tensor parallelism, the expert-parallel group."""
    if topology.current().built(EXPERT_MODEL, group_name) is not None:
        return _expert_group(EXPERT_MODEL, group_name)
    return _get_expert_parallel_group(group_name)


class _GroupTable(MutableMapping):
    """``{group name: this rank's group}`` of one expert dimension in the current topology,
    read live (upstream's ``_EXPERT_PARALLEL_GROUP`` dicts); deleting a name forgets the
    dimension, so the next MoE layer of that size builds it again."""

    def __init__(self, dim_name):
        self.dim_name = dim_name

    def __getitem__(self, group_name):
        if topology.current().built(self.dim_name, group_name) is None:
            raise KeyError(group_name)
        return topology.current().group(self.dim_name, group_name)

    def __setitem__(self, group_name, group):
        raise TypeError(f"expert groups are built by the topology: call "
                        f"deepspeed.utils.groups._create_expert_and_data_parallel(ep_size) "
                        f"instead of assigning {group_name!r}")

    def __delitem__(self, group_name):
        if topology.current().built(self.dim_name, group_name) is None:
            raise KeyError(group_name)
        for dim_name in _KINDS:
            topology.current().remove(dim_name, group_name)

    def __iter__(self):
        return iter(topology.current().keys(self.dim_name))

    def __len__(self):
        return len(topology.current().keys(self.dim_name))


_EXPERT_PARALLEL_GROUP = _GroupTable(EXPERT)
_EXPERT_DATA_PARALLEL_GROUP = _GroupTable(EXPERT_DATA)


def _get_expert_parallel_group_dict():
    return _EXPERT_PARALLEL_GROUP


def _get_expert_data_parallel_group_dict():
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
    sizes = [int(name[len("ep_size_"):]) for name in topology.current().keys(EXPERT)]
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
        topology.set_unit(mpu)
    ensure_expert_groups(ep_size)


__all__ = ["_expert_group_name", "_expert_layout", "_create_expert_and_data_parallel",
           "_get_expert_parallel_group", "_get_expert_data_parallel_group",
           "_get_expert_replica_group", "_get_expert_model_parallel_group",
           "_EXPERT_PARALLEL_GROUP", "_EXPERT_DATA_PARALLEL_GROUP",
           "_get_expert_parallel_group_dict", "_get_expert_data_parallel_group_dict",
           "_get_expert_parallel_world_size", "_get_expert_parallel_rank",
           "_get_expert_parallel_src_rank", "_get_expert_data_parallel_world_size",
           "_get_expert_data_parallel_rank", "_get_expert_data_parallel_src_rank",
           "_get_max_expert_size", "_get_max_expert_size_name", "_get_max_expert_parallel_group",
           "initialize"]
