"""The tensor x data parallel layout of the topology, its model-parallel unit, and upstream's
names for it in ``deepspeed.utils.groups`` (``get_tensor_model_parallel_group()``,
``init_tensor_parallel_groups``, ``_init_tp_mesh_device``, ...; registered under the
entry-point group ``deepspeed.exports.utils.groups``).

The layout is a ``ParallelMesh`` (a ``DeviceMesh`` with axes ``("data", "tensor")``): ``tp_size``
consecutive ranks share one model split by tensor parallelism, the ranks with the same
tensor-parallel rank form the data-parallel groups (the Megatron layout, the one Accelerate's
``tp`` device mesh assumes when it gives every rank of a tensor-parallel group the same
batches): ``rank = dp_rank * tp_size + tp_rank``. TP 2 x DP 2: the topology's ``"tensor"``
dimension has the groups [0, 1], [2, 3]; ``"tensor.data"`` [0, 2], [1, 3].
"""
from deepspeed import comm as dist
from deepspeed import topology
from deepspeed.hooks import ParallelMesh

MESH, TENSOR, DATA = "tensor", "tensor", "tensor.data"


class TensorParallelGroups:
    """The model-parallel unit of AutoTP training and Domino: a view onto the ``"tensor"``
    mesh of the topology it was built in. Building it is collective (every rank adds the same
    mesh). It answers the Megatron getters (``get_tensor_model_parallel_group()`` /
    ``get_model_parallel_*`` and ``get_data_parallel_*``), so it is what
    ``deepspeed.initialize(mpu=...)``, the engine and ``deepspeed.utils.groups`` read;
    ``init_tensor_parallel_groups`` registers it."""

    def __init__(self, tp_size):
        if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
            raise ValueError(f"tensor parallel size must be a positive int, got {tp_size!r}")
        if not dist.is_initialized():
            raise RuntimeError(f"tensor parallelism (tp_size={tp_size}) needs the distributed "
                               f"backend: call deepspeed.init_distributed() first")
        world = dist.get_world_size()
        if world % tp_size:
            raise ValueError(f"tensor parallel size {tp_size} does not divide the world size "
                             f"{world}; use a tp_size that divides it (the other factor is the "
                             f"data-parallel size)")
        self.topology = topology.current()
        self.world = dist.get_world_group()
        self._data, self._tensor = self.topology.add(
            ParallelMesh(MESH, ("data", "tensor"), (world // tp_size, tp_size)))
        self.tp_size, self.dp_size = self._tensor.size, self._data.size
        self.tp_rank, self.dp_rank = self._tensor.rank, self._data.rank
        self.tp_ranks, self.dp_ranks = list(self._tensor.ranks), list(self._data.ranks)
        self.tp_group, self.dp_group = self._tensor.group, self._data.group

    @property
    def device_mesh(self):
        """The ``DeviceMesh`` (axes ``data``, ``tensor``) of this layout."""
        return self.topology.mesh(MESH)

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
    them as the model-parallel unit of the current topology; returns the
    ``TensorParallelGroups``. Collective. The same size again, in the same world, returns the
    registered unit without building anything."""
    current = topology.current().unit
    if (isinstance(current, TensorParallelGroups) and current.world is dist.get_world_group()
            and current.tp_size == tensor_model_parallel_size):
        return current
    unit = TensorParallelGroups(tensor_model_parallel_size)
    topology.set_unit(unit)
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


def _tensor_dimension():
    """The unit's tensor-parallel getters when it has them (a pipeline grid's model-parallel
    group also spans its stages), else its model-parallel ones."""
    unit = topology.current().unit
    return "tensor_model" if hasattr(unit, "get_tensor_model_parallel_group") else "model"


def get_tensor_model_parallel_group():
    """The ranks that hold the other slices of this rank's tensor-parallel weights."""
    return topology.current().group(
        _tensor_dimension(), hint="tensor parallelism is not configured in this run (its "
        "world size is 1); build it with deepspeed.utils.groups.init_tensor_parallel_groups("
        "tp_size) or register a Megatron-style mpu with deepspeed.initialize(mpu=...)")


def get_tensor_model_parallel_world_size():
    return topology.current().size(_tensor_dimension())


def get_tensor_model_parallel_rank():
    return topology.current().rank(_tensor_dimension())


def get_tensor_model_parallel_src_rank():
    """Global rank of the first member of this rank's tensor-parallel group (the rank whose
    batch the others of the group would receive)."""
    return dist.get_global_rank(get_tensor_model_parallel_group(), 0)


__all__ = ["TensorParallelGroups", "init_tensor_parallel_groups", "_init_tp_mesh_device",
           "get_tensor_model_parallel_group", "get_tensor_model_parallel_world_size",
           "get_tensor_model_parallel_rank", "get_tensor_model_parallel_src_rank"]
