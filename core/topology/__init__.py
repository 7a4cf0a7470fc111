"""One object that owns every process group of a run: ``deepspeed.topology.Topology``.

The idea is torchtitan's ``ParallelDims``: instead of each feature keeping its process groups in
module globals, the ways a run is split across ranks are *dimensions* of one object, asked by
name. ``engine.topology`` is that object for an engine; ``deepspeed.utils.groups`` and the
Megatron-style ``mpu`` interface are views onto it.

Dimensions
    ``"data"`` and ``"model"`` are the engine's: the ranks gradients are averaged over, and
    the ranks that together hold one copy of the model (checkpoints are written per model rank).
    They are answered by the *model-parallel unit* (``mpu``) the engine was given
    (``deepspeed.initialize(mpu=...)`` or a plugin's ``deepspeed_model_parallel_unit``), through
    Megatron's getters ``get_data_parallel_group()`` ...; without one, "data" is the world and
    "model" each rank alone. Every other dimension is contributed by the plugin that owns it,
    under a name of its own (the core knows none of them): a ``deepspeed.hooks.ParallelDim``
    (any partition of the ranks: every group as a list of global ranks, optionally one instance
    per ``key``) or a ``deepspeed.hooks.ParallelMesh`` (dense axes over the whole world).
    Plugins contribute them through the ``deepspeed_parallel_dims`` hook while an engine is
    built, or by ``current().add(...)`` when the groups are needed earlier. By convention a
    plugin's dimensions are named after it: ``"expert"`` / ``"expert_data"`` (moe, one per
    ``ep_size_N`` key), ``"tensor"`` / ``"tensor.data"`` (tensor_parallel), ``"sequence"``,
    ``"sequence.data"``, ``"sequence_data"`` (sequence), ``"pipe"``, ``"pipe.data"``,
    ``"pipe.model"``, ``"pipe.model_parallel"``, ``"pipe.tied"`` (pipe), ``"mics.*"`` /
    ``"zeropp.*"`` (zero), ``"inference.tensor"`` (inference).

    A generic rule makes a unit answer any dimension: ``group("x")`` first asks the unit for
    ``get_x_parallel_group()`` (``size`` ``get_x_parallel_world_size()``, ``rank``
    ``get_x_parallel_rank()``), so a user's Megatron ``mpu`` answers for the dimensions it
    knows. Then the dimensions built here answer, then the defaults: a dimension nobody built
    has size 1 and rank 0, and asking for its *group* is an error, never ``None`` (``None``
    means "the world" to ``torch.distributed``: a collective silently run over the world gives
    wrong numbers instead of a failure).

Where DeviceMesh fits
    A ``ParallelMesh`` is a ``torch.distributed.device_mesh.DeviceMesh``: its groups are built
    here (through ``deepspeed.comm.new_group``, so they get the run's timeout and are shared,
    see below), then wrapped with ``DeviceMesh.from_group``; ``topology.mesh(name)`` returns
    it for DTensor / FSDP2-style code. What a DeviceMesh cannot express is built as plain
    groups behind the same interface: expert-parallel layouts (several at once, one per
    expert-parallel size, each cutting the *data-parallel* ranks of every model-parallel slice,
    so not an axis of the world grid), flattened pairs of non-adjacent axes (a pipeline's
    pipe x tensor "model" groups), and a user-supplied Megatron ``mpu``, of which only this
    rank's groups are known (its full layout is gathered only when a plugin asks for
    ``rank_lists``).

Group creation
    Adding a dimension is collective: every rank adds the same dimensions in the same order.
    Groups are created once per *layout* (the tuple of all rank lists) and per world: the
    process topology keeps them, and every topology made from it (each engine's) shares them,
    so re-adding a layout (an MoE layer of a second engine, a test that rebuilds its groups)
    creates no new group. A rank list equal to the whole world is the world group.

Before an engine exists, and adoption
    Some groups are needed before ``deepspeed.initialize``: MoE layers built by the model's
    constructor, ``deepspeed.utils.groups.initialize(ep_size, mpu)``, sequence parallelism set
    up for Hugging Face / ALST (``initialize_sequence_parallel``), ``tp_model_init``, a
    ``PipelineModule``'s grid. They go into the *process topology*
    (``process_topology()``: one per process and world, replaced when the distributed backend is
    destroyed and initialised again), which ``current()`` returns while no engine is live;
    ``groups.set_mpu(unit)`` registers the unit it answers "data" / "model" from. An engine
    makes its own topology as a child of the process topology: it adopts every dimension built
    so far (the same groups, nothing rebuilt), answers "data" / "model" from the engine's unit
    only, and adds the dimensions its enabled plugins contribute. While the engine lives (until
    ``engine.destroy()``) it is ``current()``, so ``deepspeed.utils.groups`` answers for it
    and groups built meanwhile (an MoE layer re-laid out for the engine's unit) are the
    engine's. The two slots below are the only module-level state holding process groups in
    the package; ``tests/core/test_process_group_globals.py`` enforces that.

Views
    A *unit* a plugin builds (``TensorParallelGroups``, the sequence plugin's
    ``parallel_state`` module, a pipeline's ``PipelineParallelGrid``) keeps the Megatron ``mpu``
    interface for ``deepspeed.initialize(mpu=...)`` and integrations, and reads its dimensions
    with ``built(name)`` (not ``group``, which would ask the unit back). ``deepspeed.utils.groups``
    (``deepspeed.topology.groups``, installed at the upstream path through
    ``core/upstream_paths``) answers from ``current()``: the core defines the "data" / "model"
    functions; the expert, tensor-parallel and sequence names are exported into it by their
    plugins through the entry-point group ``deepspeed.exports.utils.groups``
    (``deepspeed.utils.lazy_exports.plugin_exports``), and ``groups.mpu`` is ``current().unit``.
    ``engine.dp_group`` stays what it was (the unit's data-parallel group, None for the world
    without a unit), ``engine.mpu`` the unit and ``engine.dp_world_size`` its size.
"""
import math

import torch

from deepspeed import comm as dist
from deepspeed.hooks import ParallelDim, ParallelMesh

#: the dimensions the engine's model-parallel unit answers; no plugin may add one of them
UNIT_DIMENSIONS = ("data", "model")


class MissingDimension(RuntimeError):
    """A group was asked for a dimension this topology does not have."""


class Dimension:
    """One built dimension as seen from this rank: every group's ranks (``rank_lists``), and
    this rank's ``group`` and ``ranks`` (empty, with ``group`` None, for a rank in none)."""

    __slots__ = ("name", "key", "rank_lists", "group", "ranks", "basis", "_rank")

    def __init__(self, name, key, rank_lists, groups, basis, rank):
        self.name, self.key, self.basis = name, key, basis
        self.rank_lists = rank_lists
        self.group, self.ranks = None, ()
        for ranks, group in zip(rank_lists, groups):
            if rank in ranks:
                self.group, self.ranks = group, ranks
        self._rank = self.ranks.index(rank) if self.ranks else None

    @property
    def size(self):
        return len(self.ranks)

    @property
    def rank(self):
        return self._rank

    def __repr__(self):
        key = "" if self.key is None else f"[{self.key!r}]"
        return f"Dimension({self.name!r}{key}, ranks={list(self.ranks)})"


def _describe(name, key):
    return repr(name) if key is None else f"{name!r} (key {key!r})"


class Topology:
    """The process groups of one engine, or of the process before an engine exists (see the
    module docstring). ``unit`` is the model-parallel unit answering "data" / "model";
    ``parent`` the topology whose dimensions this one adopts."""

    def __init__(self, unit=None, parent=None):
        self.unit = unit
        self.parent = parent
        self.world_group = dist.get_world_group() if dist.is_initialized() else None
        self._dims = {}  # (name, key) -> Dimension
        self._meshes = {}  # mesh name -> (dimension names, DeviceMesh)
        # layout (tuple of rank tuples) -> its groups, shared by the whole family
        self.layouts = parent.layouts if parent is not None else {}

    # ------------------------------------------------------------------ the world
    def in_current_world(self):
        """False once the world this topology was built in has been destroyed (its groups are
        dead handles). A topology made before the backend existed joins the first world."""
        if not dist.is_initialized():
            return self.world_group is None
        if self.world_group is None and not self._dims and not self.layouts:
            self.world_group = dist.get_world_group()
        return self.world_group is dist.get_world_group()

    # ------------------------------------------------------------------ building (collective)
    def add(self, *contributions):
        """Build the given ``ParallelDim`` / ``ParallelMesh`` contributions (collective, in this
        order on every rank); returns the ``Dimension`` of each (one per mesh axis). A
        dimension of the same name and key built here before is replaced."""
        built = []
        for item in contributions:
            if isinstance(item, ParallelMesh):
                built.extend(self._add_mesh(item))
            elif isinstance(item, ParallelDim):
                built.append(self._add_dim(item.name, item.key, item.rank_lists, item.basis))
            else:
                raise TypeError(f"a topology is made of deepspeed.hooks.ParallelDim or "
                                f"ParallelMesh contributions, got {type(item).__name__}")
        return built

    def remove(self, name, key=None):
        """Forget a dimension built here (its groups stay cached for a re-add); a mesh axis
        takes its whole mesh with it. Dimensions adopted from the parent are not touched."""
        for mesh_name, (names, _) in list(self._meshes.items()):
            if name in names and key is None:
                del self._meshes[mesh_name]
                for member in names:
                    self._dims.pop((member, None), None)
        self._dims.pop((name, key), None)

    def _add_dim(self, name, key, rank_lists, basis=None):
        self._check_name(name)
        lists = self._checked_lists(name, rank_lists)
        dim = Dimension(name, key, lists, self._groups_for(lists), basis, dist.get_rank())
        self._dims[(name, key)] = dim
        return dim

    def _add_mesh(self, mesh):
        axes, sizes = tuple(mesh.axes), tuple(mesh.sizes)
        if len(axes) != len(sizes) or not axes or len(set(axes)) != len(axes):
            raise ValueError(f"ParallelMesh {mesh.name!r} needs one size per distinct axis name, "
                             f"got axes={axes}, sizes={sizes}")
        world = dist.get_world_size()
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes) \
                or math.prod(sizes) != world:
            raise ValueError(f"ParallelMesh {mesh.name!r}: sizes {dict(zip(axes, sizes))} must "
                             f"be positive ints whose product is the world size {world}")
        names = tuple(mesh.name if axis == mesh.name else f"{mesh.name}.{axis}" for axis in axes)
        grid = torch.arange(world).reshape(sizes)
        dims = [self._add_dim(name, None, grid.movedim(i, -1).reshape(-1, size).tolist())
                for i, (name, size) in enumerate(zip(names, sizes))]
        from torch.distributed.device_mesh import DeviceMesh

        from deepspeed.accelerator import get_accelerator

        device_mesh = DeviceMesh.from_group([dim.group for dim in dims],
                                            get_accelerator().device_name(), mesh=grid,
                                            mesh_dim_names=axes)
        self._meshes[mesh.name] = (names, device_mesh)
        return dims

    @staticmethod
    def _check_name(name):
        if not isinstance(name, str) or not name:
            raise ValueError(f"a parallel dimension needs a non-empty str name, got {name!r}")
        if name in UNIT_DIMENSIONS:
            raise ValueError(f"the parallel dimension {name!r} is answered by the engine's "
                             f"model-parallel unit (mpu); a plugin names its own dimensions "
                             f"(reserved: {', '.join(UNIT_DIMENSIONS)})")

    @staticmethod
    def _checked_lists(name, rank_lists):
        """The rank lists as sorted tuples (torch numbers a group's ranks in ascending order),
        each rank at most once, all within the world."""
        world = dist.get_world_size()
        lists, seen = [], set()
        for ranks in rank_lists:
            ranks = tuple(sorted(int(r) for r in ranks))
            bad = [r for r in ranks if not 0 <= r < world]
            twice = seen.intersection(ranks) or len(set(ranks)) != len(ranks)
            if not ranks or bad or twice:
                raise ValueError(f"parallel dimension {name!r}: rank lists {list(rank_lists)} "
                                 f"must be non-empty lists of distinct ranks in [0, {world}), "
                                 f"no rank in two lists")
            seen.update(ranks)
            lists.append(ranks)
        return tuple(lists)

    def _groups_for(self, lists):
        """The process group of each rank list, created once per layout (collective)."""
        groups = self.layouts.get(lists)
        if groups is None:
            whole = tuple(range(dist.get_world_size()))
            groups = [dist.get_world_group() if ranks == whole else dist.new_group(list(ranks))
                      for ranks in lists]
            self.layouts[lists] = groups
        return groups

    # ------------------------------------------------------------------ reading
    def built(self, name, key=None):
        """The ``Dimension`` built here or adopted from the parent, or None. Units that are
        views onto a topology read their dimensions through this (not ``group``, which would
        ask them back)."""
        dim = self._dims.get((name, key))
        if dim is None and self.parent is not None:
            return self.parent.built(name, key)
        return dim

    def keys(self, name):
        """The keys of the instances of dimension ``name`` (e.g. one per expert-parallel size)."""
        found = set(self.parent.keys(name)) if self.parent is not None else set()
        found.update(key for (n, key) in self._dims if n == name and key is not None)
        return sorted(found)

    def mesh(self, name):
        """The ``DeviceMesh`` of the ``ParallelMesh`` called ``name``."""
        if name in self._meshes:
            return self._meshes[name][1]
        if self.parent is not None:
            return self.parent.mesh(name)
        raise MissingDimension(f"no parallel mesh named {name!r} was built "
                               f"(meshes: {sorted(self._meshes) or 'none'})")

    def _unit_answer(self, name, key, what):
        if self.unit is None or key is not None:
            return None
        getter = getattr(self.unit, f"get_{name}_parallel_{what}", None)
        return getter() if getter is not None else None

    def _from_dim(self, name, key, hint):
        dim = self.built(name, key)
        if dim is not None and dim.group is None:
            raise MissingDimension(f"rank {dist.get_rank()} is in no group of the parallel "
                                   f"dimension {_describe(name, key)} "
                                   f"(groups: {[list(r) for r in dim.rank_lists]})")
        if dim is None and (key is not None or hint is not None):
            raise self._missing(name, key, hint)
        return dim

    def _missing(self, name, key, hint=None):
        built = sorted({n if k is None else f"{n}[{k}]" for n, k in self.dimensions()})
        return MissingDimension(
            f"no {_describe(name, key)} parallel group exists"
            + (f": {hint}" if hint else "")
            + f" (this topology has: {', '.join(built) or 'no dimensions'}"
            + (", and a model-parallel unit" if self.unit is not None else "") + ")")

    def dimensions(self):
        """``{(name, key)}`` of every dimension built here or adopted from the parent."""
        found = set(self.parent.dimensions()) if self.parent is not None else set()
        return found | set(self._dims)

    def group(self, name, key=None, hint=None):
        """This rank's process group along the dimension; an error naming what exists when
        there is none (``hint`` says how to create it)."""
        answer = self._unit_answer(name, key, "group")
        if answer is not None:
            return answer
        dim = self.built(name, key)
        if dim is None:
            if name == "data" and key is None:
                return dist.get_world_group()
            raise self._missing(name, key, hint)
        return self._from_dim(name, key, hint).group

    def size(self, name, key=None):
        """The number of ranks in this rank's group along the dimension (1 for an unkeyed
        dimension nobody built; the world for "data" without a unit)."""
        return self._answer(name, key, "world_size", dist.get_world_size, "size", 1)

    def rank(self, name, key=None):
        """This rank's index in its group along the dimension (0 for one nobody built)."""
        return self._answer(name, key, "rank", dist.get_rank, "rank", 0)

    def _answer(self, name, key, getter, of_group, attribute, default):
        """The unit's getter, else its group's, else the built dimension's, else the default
        (the world's answer for "data")."""
        answer = self._unit_answer(name, key, getter)
        if answer is None:
            group = self._unit_answer(name, key, "group")
            if group is not None:
                return of_group(group=group)
        if answer is not None:
            return answer
        if self.built(name, key) is not None:
            return getattr(self._from_dim(name, key, None), attribute)
        if name == "data" and key is None:
            return of_group()
        if key is not None:
            raise self._missing(name, key)
        return default

    def ranks(self, name, key=None):
        """The global ranks of this rank's group along the dimension, in group-rank order."""
        if self._unit_answer(name, key, "group") is None:
            if self.built(name, key) is not None:
                return list(self._from_dim(name, key, None).ranks)
            if name == "data" and key is None:
                return list(range(dist.get_world_size()))
            if key is None:
                return [dist.get_rank()]  # nobody built it: this rank alone
        group = self.group(name, key)
        return [int(dist.get_global_rank(group, i))
                for i in range(dist.get_world_size(group=group))]

    def rank_lists(self, name, key=None):
        """Every group of the dimension as its global ranks, ordered by first rank. For a
        dimension only the unit knows (a user's ``mpu`` tells each rank its own group), the
        lists are gathered from every rank: collective over the world."""
        unit_group = self._unit_answer(name, key, "group")
        dim = self.built(name, key)
        if dim is not None and (unit_group is None or unit_group is dim.group):
            return [list(ranks) for ranks in sorted(dim.rank_lists)]
        world = dist.get_world_size()
        if unit_group is None:
            if name == "data" and key is None:
                return [list(range(world))]
            if key is not None:
                raise self._missing(name, key)
            return [[rank] for rank in range(world)]
        if dist.get_world_size(group=unit_group) == world:
            return [list(range(world))]
        gathered = [None] * world
        dist.all_gather_object(gathered, self.ranks(name, key))
        lists = sorted({tuple(ranks) for ranks in gathered})
        covered = sorted(rank for ranks in lists for rank in ranks)
        if covered != list(range(world)) or len({len(ranks) for ranks in lists}) != 1:
            raise RuntimeError(f"the model-parallel unit's {name!r} groups {lists} do not split "
                               f"the {world} ranks into groups of one size")
        return [list(ranks) for ranks in lists]

    def __repr__(self):
        dims = ", ".join(repr(d) for d in self._dims.values())
        return (f"Topology(unit={type(self.unit).__name__ if self.unit is not None else None}, "
                f"dims=[{dims}], parent={'yes' if self.parent is not None else 'no'})")


# The only module-level state holding process groups (see the module docstring).
_process = None  # the process topology: what exists before (and besides) any engine
_current = None  # the live engine's topology, or None


def process_topology():
    """The topology of this process and world that groups needed before an engine go into."""
    global _process
    if _process is None or not _process.in_current_world():
        _process = Topology()
    return _process


def current():
    """The topology ``deepspeed.utils.groups`` answers from: the live engine's, else the
    process topology."""
    if _current is not None and _current.in_current_world():
        return _current
    return process_topology()


def for_engine(unit):
    """A new engine topology: adopts the process topology's dimensions, answers "data" /
    "model" from ``unit`` (None: the world / each rank alone)."""
    return Topology(unit=unit, parent=process_topology())


def activate(topology):
    """Make ``topology`` (None: none, the process topology answers) the current one; returns
    the previous, for the engine to restore when it is destroyed."""
    global _current
    previous, _current = _current, topology
    return previous


def set_unit(unit):
    """Register the model-parallel unit the current topology answers "data" / "model" from
    (None clears it); returns the previous one (``deepspeed.utils.groups.set_mpu``)."""
    topology = current()
    previous, topology.unit = topology.unit, unit
    return previous


__all__ = ["Topology", "Dimension", "MissingDimension", "ParallelDim", "ParallelMesh",
           "UNIT_DIMENSIONS", "process_topology", "current", "for_engine", "activate", "set_unit"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
