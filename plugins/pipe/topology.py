"""Which rank sits where in a pipeline × data × tensor-parallel grid
(``deepspeed.runtime.pipe.topology``).

``ProcessTopology`` is pure bookkeeping: it numbers the points of an n-dimensional Cartesian grid
in row-major order (the last axis varies fastest) and answers questions about that numbering
without touching any process group, so it can be built and tested anywhere. Pipeline code names
its axes ``pipe`` (the stage), ``data`` (replicas) and ``model`` (tensor slices).

``PipelineParallelGrid`` is the one piece that talks to ``deepspeed.comm``: it adds the process
groups of a topology to the run's process-group topology (``deepspeed.topology``, as the
dimensions ``"pipe"``, ``"pipe.data"``, ``"pipe.model"`` and ``"pipe.model_parallel"``) and
answers, for the calling rank, the Megatron-style *model-parallel unit* questions
(``get_data_parallel_group()`` ...) that the engine, ``deepspeed.utils.groups`` and the
checkpoint code ask of an ``mpu``.
"""
from collections import namedtuple
from itertools import product

from deepspeed import comm as dist
from deepspeed import topology as ds_topology
from deepspeed.hooks import ParallelDim, ParallelMesh

PIPE, DATA, MODEL = "pipe", "data", "model"
#: the topology dimension of the ranks that together hold one copy of the model (pipe x tensor)
MODEL_PARALLEL = "pipe.model_parallel"


class ProcessTopology:
    """Maps n-dimensional Cartesian coordinates to linear ranks and back.

    With ``axes=['x', 'y']`` and ``dims=[2, 3]`` the ranks are laid out row-major, so ``(x, y)``
    and ``(x, y + 1)`` get adjacent ranks::

        >>> X = ProcessTopology(['x', 'y'], [2, 3])
        >>> X.get_rank(x=0, y=1)
        1
        >>> X.get_coord(4)
        ProcessCoord(x=1, y=1)

    Coordinates are ``ProcessCoord`` namedtuples whose fields are the axis names.
    """

    def __init__(self, axes, dims):
        axes, dims = list(axes), list(dims)
        if len(axes) != len(dims):
            raise ValueError(f"ProcessTopology needs one dimension per axis, got axes={axes} "
                             f"and dims={dims}")
        if len(set(axes)) != len(axes):
            raise ValueError(f"ProcessTopology axis names must be unique, got {axes}")
        for axis, dim in zip(axes, dims):
            if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
                raise ValueError(f"ProcessTopology dimension of axis {axis!r} must be a positive "
                                 f"integer, got {dim!r}")
        self.axes = axes
        self.dims = dims
        self.ProcessCoord = namedtuple("ProcessCoord", axes)
        # itertools.product varies its last range fastest: exactly the row-major numbering.
        self.mapping = {}
        self._coords = []  # rank -> coordinate, the inverse of `mapping`
        for rank, point in enumerate(product(*(range(d) for d in dims))):
            coord = self.ProcessCoord(*point)
            self.mapping[coord] = rank
            self._coords.append(coord)

    # ------------------------------------------------------------------ rank <-> coordinate
    def _check_axes(self, names, what):
        unknown = [name for name in names if name not in self.axes]
        if unknown:
            raise ValueError(f"{what}: unknown axis {', '.join(map(repr, unknown))}; this "
                             f"topology's axes are {self.axes}")

    def get_rank(self, **coord_kwargs):
        """The global rank of the process at the given coordinate (every axis must be given).

        >>> ProcessTopology(['x', 'y'], [2, 3]).get_rank(x=0, y=1)
        1
        """
        self._check_axes(coord_kwargs, "get_rank()")
        if len(coord_kwargs) != len(self.axes):
            raise ValueError("get_rank() does not support slices. Use filter_match())")
        key = self.ProcessCoord(**coord_kwargs)
        if key not in self.mapping:  # an explicit raise: asserts vanish under python -O
            raise AssertionError(f"key {coord_kwargs} invalid")
        return self.mapping[key]

    def get_coord(self, rank):
        """The ``ProcessCoord`` of the process with the given global rank."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(self._coords):
            raise ValueError(f"rank {rank} not found in topology.")
        return self._coords[rank]

    def get_axis_names(self):
        """The axis names, in topology order."""
        return self.axes

    def get_dim(self, axis):
        """The number of processes along ``axis`` (0 for an axis this topology does not have)."""
        if axis not in self.axes:
            return 0
        return self.dims[self.axes.index(axis)]

    def world_size(self):
        """The number of processes in the grid (the product of the dimensions)."""
        return len(self.mapping)

    def get_rank_repr(self, rank, omit_axes=["data", "pipe"], inner_sep="_", outer_sep="-"):
        """A string naming ``rank`` by its coordinates, used in checkpoint file names.

        Each axis not in ``omit_axes`` becomes ``f"{axis}{inner_sep}{coord:02d}"``; the pieces are
        joined with ``outer_sep``. Data and pipe are omitted by default because every replica and
        every stage writes its own layers' files anyway.

        >>> ProcessTopology(['a', 'b'], [2, 2]).get_rank_repr(3)
        'a_01-b_01'
        """
        coord = self.get_coord(rank)
        omit = set(omit_axes)
        return outer_sep.join(f"{axis}{inner_sep}{getattr(coord, axis):02d}"
                              for axis in self.axes if axis not in omit)

    # ------------------------------------------------------------------ groups of ranks
    def get_axis_comm_lists(self, axis):
        """The rank lists of the communicators along ``axis``.

        Each list holds the ranks that agree on every *other* axis, ordered by their coordinate
        on ``axis``; there is one list per combination of the other axes, in row-major order.
        An axis this topology does not have gives ``[]``.

        >>> ProcessTopology(['pipe', 'data', 'model'], [2, 2, 2]).get_axis_comm_lists('pipe')
        [[0, 4], [1, 5], [2, 6], [3, 7]]
        """
        if axis not in self.axes:
            return []
        others = [a for a in self.axes if a != axis]
        lists = []
        for point in product(*(range(self.get_dim(a)) for a in others)):
            fixed = dict(zip(others, point))
            lists.append([self.mapping[self.ProcessCoord(**fixed, **{axis: i})]
                          for i in range(self.get_dim(axis))])
        return lists

    def filter_match(self, **filter_kwargs):
        """The ranks (ascending) whose coordinates match every ``axis=value`` criterion.

        >>> ProcessTopology(['pipe', 'data', 'model'], [2, 2, 2]).filter_match(pipe=0, data=1)
        [2, 3]
        """
        self._check_axes(filter_kwargs, "filter_match()")
        return [rank for rank, coord in enumerate(self._coords)
                if all(getattr(coord, axis) == value for axis, value in filter_kwargs.items())]

    def get_axis_list(self, axis, idx):
        """The global ranks (ascending) whose coordinate on ``axis`` equals ``idx``.

        >>> ProcessTopology(['x', 'y'], [2, 3]).get_axis_list('y', 0)
        [0, 3]
        """
        self._check_axes([axis], "get_axis_list()")
        return self.filter_match(**{axis: idx})

    def __str__(self):
        return str(self.mapping)


def _prime_factors(N):
    """The prime factors of ``N`` in ascending order, with multiplicity."""
    if isinstance(N, bool) or not isinstance(N, int) or N <= 0:
        raise ValueError(f"Values must be strictly positive integers, got {N!r}")
    factors, p = [], 2
    while N > 1:
        while N % p == 0:
            factors.append(p)
            N //= p
        p += 1
        if p * p > N > 1:  # what is left is prime
            factors.append(N)
            break
    return factors


class PipeDataParallelTopology(ProcessTopology):
    """Pipeline × data parallelism: axes ``['pipe', 'data']``, so the replicas of one stage are
    adjacent ranks (gradient all-reduces stay within a node when they can)."""

    def __init__(self, num_pp, num_dp):
        super().__init__(axes=[PIPE, DATA], dims=[num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    """Pipeline × data × tensor parallelism: axes ``['pipe', 'data', 'model']`` with dims
    ``[num_pp, num_dp, num_mp]``, so tensor slices (the chattiest groups) are adjacent ranks."""

    def __init__(self, num_pp, num_mp, num_dp):
        super().__init__(axes=[PIPE, DATA, MODEL], dims=[num_pp, num_dp, num_mp])


class PipelineParallelGrid:
    """The process groups of a topology, seen from the calling rank: the ``mpu`` of pipeline
    training.

    Construction is collective: every rank adds the same dimensions to the process-group topology,
    in the same order, because ``new_group`` must be called by all processes. A layout shared by
    two kinds of group (pipe × data has ``model-parallel`` = ``pipe`` groups) is created once.

    Groups, for this rank:

    * data parallel: the ranks that hold the same stage and tensor slice (``data`` axis);
    * pipe parallel: the stages of this rank's pipeline (``pipe`` axis);
    * slice / tensor parallel: the tensor slices of this rank's layers (``model`` axis; a group
      of this rank alone without one);
    * model parallel: everything that together holds *one* copy of the model, i.e. all ranks
      with this rank's data coordinate (pipe × tensor). This is what the engine's checkpoint code
      numbers ``mp_rank_XX`` files by, so every stage writes its own file; code that wants the
      tensor-slicing group asks ``get_tensor_model_parallel_*`` / ``get_slice_parallel_*``.

    Without a topology the world is split between pipe and data by dealing its prime factors
    (ascending) alternately to pipe and data, as upstream does.
    """

    def __init__(self, topology=None, process_group=None):
        self.global_rank = dist.get_rank()
        self.world_size = dist.get_world_size(group=process_group)
        if process_group is not None and self.world_size != dist.get_world_size():
            raise ValueError(f"PipelineParallelGrid ranks are global ranks: process_group must "
                             f"span the whole world ({dist.get_world_size()} ranks), got one of "
                             f"{self.world_size}")
        self.process_group = process_group
        if topology is None:
            topology = self._default_topology(self.world_size)
        if topology.world_size() != self.world_size:
            raise ValueError(f"the topology has {topology.world_size()} ranks "
                             f"({dict(zip(topology.axes, topology.dims))}) but the world has "
                             f"{self.world_size}")
        self._topo = topology
        self.data_parallel_size = max(topology.get_dim(DATA), 1)
        self.pipe_parallel_size = max(topology.get_dim(PIPE), 1)
        self.model_parallel_size = max(topology.get_dim(MODEL), 1)
        self.slice_parallel_size = self.model_parallel_size
        self.stage_id = self.get_stage_id()
        self.data_parallel_id = self.get_data_parallel_id()

        # The groups are dimensions of the process-group topology (``deepspeed.topology``): the
        # grid's axes as one ``DeviceMesh`` ("pipe", "pipe.data", "pipe.model"), a missing
        # pipe / data / model axis as each rank alone, and the model-parallel groups (pipe x
        # tensor, not adjacent axes of the mesh) as plain groups. Every rank adds the same.
        built = ds_topology.current()
        names = [PIPE if axis == PIPE else f"{PIPE}.{axis}" for axis in topology.axes]
        dims = dict(zip(names, built.add(ParallelMesh(PIPE, tuple(topology.axes),
                                                      tuple(topology.dims)))))
        singles = tuple((rank,) for rank in range(self.world_size))
        for axis in (PIPE, DATA, MODEL):
            name = PIPE if axis == PIPE else f"{PIPE}.{axis}"
            if name not in dims:
                dims[name], = built.add(ParallelDim(name, singles))
        self.model_groups = [topology.filter_match(**{DATA: d}) if DATA in topology.axes
                             else list(range(self.world_size))
                             for d in range(self.data_parallel_size)]
        dims[MODEL_PARALLEL], = built.add(ParallelDim(MODEL_PARALLEL,
                                                      tuple(map(tuple, self.model_groups))))
        self.ds_model_group, self.ds_model_proc_group = self._mine(dims[MODEL_PARALLEL])
        self.ds_model_rank = self.ds_model_group.index(self.global_rank)
        self.ds_model_world_size = len(self.ds_model_group)

        self.dp_groups = self._axis_lists(DATA)
        self.dp_group, self.dp_proc_group = self._mine(dims[f"{PIPE}.{DATA}"])
        self.pipe_groups = self._axis_lists(PIPE)
        self.pp_group, self.pp_proc_group = self._mine(dims[PIPE])
        self.slice_groups = self._axis_lists(MODEL)
        self.slice_group, self.slice_proc_group = self._mine(dims[f"{PIPE}.{MODEL}"])

    @staticmethod
    def _default_topology(world_size):
        num_pp = num_dp = 1
        for idx, prime in enumerate(_prime_factors(world_size)):
            if idx % 2 == 0:
                num_pp *= prime
            else:
                num_dp *= prime
        return PipeDataParallelTopology(num_pp=num_pp, num_dp=num_dp)

    def _axis_lists(self, axis):
        """The comm lists along ``axis``; an axis the topology lacks is size 1 everywhere, so
        every rank forms a group of its own."""
        lists = self._topo.get_axis_comm_lists(axis)
        return lists if lists else [[rank] for rank in range(self.world_size)]

    @staticmethod
    def _mine(dim):
        """This rank's list and group of a topology dimension."""
        return list(dim.ranks), dim.group

    # ------------------------------------------------------------------ where this rank is
    def topology(self):
        return self._topo

    def _my(self, axis):
        coord = self._topo.get_coord(self.global_rank)
        return getattr(coord, axis) if axis in self._topo.axes else 0

    def get_stage_id(self):
        """This rank's pipeline stage."""
        return self._my(PIPE)

    def get_data_parallel_id(self):
        """This rank's coordinate on the data axis (which replica of the model it belongs to)."""
        return self._my(DATA)

    def is_first_stage(self):
        return self.stage_id == 0

    def is_last_stage(self):
        return self.stage_id == self.pipe_parallel_size - 1

    def get_global_rank(self):
        return self.global_rank

    def stage_to_global(self, stage_id, **kwargs):
        """The global rank of pipeline stage ``stage_id`` that shares every other coordinate with
        this rank (override some with ``axis=value`` keywords)."""
        if not 0 <= stage_id < self.pipe_parallel_size:
            raise ValueError(f"stage_id must be in [0, {self.pipe_parallel_size}), got {stage_id}")
        if PIPE not in self._topo.axes:
            return self.global_rank
        coord = self._topo.get_coord(self.global_rank)._replace(**{PIPE: stage_id}, **kwargs)
        return self._topo.get_rank(**coord._asdict())

    # ------------------------------------------------------------------ the mpu interface
    def get_pipe_parallel_rank(self):
        """The stage of the pipeline this rank resides in."""
        return self.get_stage_id()

    def get_pipe_parallel_world_size(self):
        return self.pipe_parallel_size

    def get_pipe_parallel_group(self):
        return self.pp_proc_group

    def get_data_parallel_rank(self):
        return self.data_parallel_id

    def get_data_parallel_world_size(self):
        return self.data_parallel_size

    def get_data_parallel_group(self):
        return self.dp_proc_group

    def get_model_parallel_rank(self):
        """This rank's index among the ranks holding one copy of the model (pipe × tensor)."""
        return self.ds_model_rank

    def get_model_parallel_world_size(self):
        return self.ds_model_world_size

    def get_model_parallel_group(self):
        return self.ds_model_proc_group

    def get_slice_parallel_rank(self):
        """This rank's tensor slice (0 without a ``model`` axis)."""
        return self._my(MODEL)

    def get_slice_parallel_world_size(self):
        return self.slice_parallel_size

    def get_slice_parallel_group(self):
        return self.slice_proc_group

    # Megatron's names for the tensor-slicing group (activation checkpointing asks these first).
    get_tensor_model_parallel_rank = get_slice_parallel_rank
    get_tensor_model_parallel_world_size = get_slice_parallel_world_size
    get_tensor_model_parallel_group = get_slice_parallel_group


__all__ = ["ProcessTopology", "PipeDataParallelTopology", "PipeModelDataParallelTopology",
           "PipelineParallelGrid"]
