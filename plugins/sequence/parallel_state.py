"""Process groups for Ulysses sequence parallelism; this module itself is the model-parallel
unit (``mpu``) handed to ``deepspeed.initialize(mpu=...)``, a view onto the sequence
dimensions of the topology (``deepspeed.topology``): it holds no group itself.

Sequence-parallel groups are blocks of consecutive ranks. Every rank loads different samples and
the Ulysses data-loader adapter shares them inside each block, so the gradient has to be averaged
over *all* sequence x data parallel ranks: that is why ``get_data_parallel_group()`` (the group
the engine and ZeRO partition and average over) answers the sequence-data-parallel group, while
the pure data-parallel group (same sequence rank, different blocks) has its own getter.
"""
from deepspeed import comm as dist
from deepspeed import topology
from deepspeed.hooks import ParallelDim, ParallelMesh

#: the topology dimensions of this layout: sequence-parallel blocks, the pure data-parallel
#: groups across them, sequence x data (every rank: the engine's data-parallel group), and each
#: rank alone (model parallelism of 1)
SEQUENCE, PURE_DATA, SEQUENCE_DATA, SINGLE = ("sequence", "sequence.data", "sequence_data",
                                              "sequence.model")
_DIMENSIONS = (SEQUENCE, SEQUENCE_DATA, SINGLE)


def _require(name):
    dim = topology.current().built(name)
    if dim is None:
        raise RuntimeError("sequence parallelism is not initialised: call "
                           "deepspeed.runtime.sequence_parallel.parallel_state_sp."
                           "initialize_sequence_parallel(sequence_parallel_size) or "
                           "UlyssesSPAttentionHF.register_with_transformers(...) first")
    return dim


def check_size(name, value):
    """Sizes here are plain ints >= 1 (no bools, no integral floats: they count ranks)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def initialize_sequence_parallel(sequence_parallel_size):
    """Add the layout to the current topology (a collective: every rank must call it with the
    same size) and register this module as its model-parallel unit."""
    check_size("sequence_parallel_size", sequence_parallel_size)
    if not dist.is_initialized():
        raise RuntimeError("sequence parallelism needs the distributed backend: call "
                           "deepspeed.comm.init_distributed() before initialize_sequence_parallel")
    world = dist.get_world_size()
    sp = sequence_parallel_size
    if world % sp != 0:
        raise ValueError(f"world size {world} is not divisible by sequence_parallel_size {sp}")
    topology.current().add(ParallelMesh(SEQUENCE, ("data", "sequence"), (world // sp, sp)),
                           ParallelDim(SEQUENCE_DATA, (tuple(range(world)),)),
                           ParallelDim(SINGLE, tuple((rank,) for rank in range(world))))
    topology.set_unit(_this_module())


def _this_module():
    import sys
    return sys.modules[__name__]


def destroy_sequence_parallel():
    """Forget the layout and unregister this unit (tests, or re-initialising with another
    size)."""
    current = topology.current()
    if current.unit is _this_module():
        topology.set_unit(None)
    for name in _DIMENSIONS:
        current.remove(name)


def is_initialized():
    return topology.current().built(SEQUENCE) is not None


def get_sequence_parallel_group():
    return _require(SEQUENCE).group


def get_sequence_parallel_world_size():
    return _require(SEQUENCE).size


def get_sequence_parallel_rank():
    return _require(SEQUENCE).rank


def get_sequence_data_parallel_group():
    return _require(SEQUENCE_DATA).group


def get_sequence_data_parallel_world_size():
    return _require(SEQUENCE_DATA).size


def get_sequence_data_parallel_rank():
    return _require(SEQUENCE_DATA).rank


# The engine's data-parallel group: see the module docstring.
get_data_parallel_group = get_sequence_data_parallel_group
get_data_parallel_world_size = get_sequence_data_parallel_world_size
get_data_parallel_rank = get_sequence_data_parallel_rank


def get_pure_data_parallel_group():
    """Ranks holding the same sequence slice of different samples."""
    return _require(PURE_DATA).group


def get_pure_data_parallel_world_size():
    return _require(PURE_DATA).size


def get_pure_data_parallel_rank():
    return _require(PURE_DATA).rank


def get_model_parallel_world_size():
    return 1


def get_model_parallel_rank():
    return 0


def get_model_parallel_group():
    """This rank alone: Ulysses has no tensor parallelism (activation checkpointing's
    partition_activations therefore keeps whole tensors)."""
    return _require(SINGLE).group
