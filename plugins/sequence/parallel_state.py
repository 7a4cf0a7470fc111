"""Process groups for Ulysses sequence parallelism; this module itself is the model-parallel
unit (``mpu``) handed to ``deepspeed.initialize(mpu=...)``.

Sequence-parallel groups are blocks of consecutive ranks. Every rank loads different samples and
the Ulysses data-loader adapter shares them inside each block, so the gradient has to be averaged
over *all* sequence x data parallel ranks: that is why ``get_data_parallel_group()`` (the group
the engine and ZeRO partition and average over) answers the sequence-data-parallel group, while
the pure data-parallel group (same sequence rank, different blocks) has its own getter.
"""
from deepspeed import comm as dist
from deepspeed.utils import groups

_state = {}


def _require(key):
    if key not in _state:
        raise RuntimeError("sequence parallelism is not initialised: call "
                           "deepspeed.runtime.sequence_parallel.parallel_state_sp."
                           "initialize_sequence_parallel(sequence_parallel_size) or "
                           "UlyssesSPAttentionHF.register_with_transformers(...) first")
    return _state[key]


def check_size(name, value):
    """Sizes here are plain ints >= 1 (no bools, no integral floats: they count ranks)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def initialize_sequence_parallel(sequence_parallel_size):
    """Build the groups (a collective: every rank must call it with the same size) and register
    this module with ``deepspeed.utils.groups``."""
    check_size("sequence_parallel_size", sequence_parallel_size)
    if not dist.is_initialized():
        raise RuntimeError("sequence parallelism needs the distributed backend: call "
                           "deepspeed.comm.init_distributed() before initialize_sequence_parallel")
    world, rank = dist.get_world_size(), dist.get_rank()
    sp = sequence_parallel_size
    if world % sp != 0:
        raise ValueError(f"world size {world} is not divisible by sequence_parallel_size {sp}")
    sp_group = dp_group = None
    for start in range(0, world, sp):  # every rank creates every group, in the same order
        ranks = list(range(start, start + sp))
        group = dist.new_group(ranks=ranks)
        if rank in ranks:
            sp_group = group
    for offset in range(sp):
        ranks = list(range(offset, world, sp))
        group = dist.new_group(ranks=ranks)
        if rank in ranks:
            dp_group = group
    mp_group = None
    for other in range(world):  # model parallelism of 1: each rank alone (activation checkpointing
        group = dist.new_group(ranks=[other])  # asks the mpu for this group)
        if other == rank:
            mp_group = group
    _state.update(sp_size=sp, sp_group=sp_group, dp_group=dp_group, mp_group=mp_group,
                  sdp_group=dist.get_world_group(), world=world, rank=rank)
    groups.set_mpu(_this_module())


def _this_module():
    import sys
    return sys.modules[__name__]


def destroy_sequence_parallel():
    """Forget the groups and unregister this unit (tests, or re-initialising with another size)."""
    if groups.mpu is _this_module():
        groups.set_mpu(None)
    _state.clear()


def is_initialized():
    return bool(_state)


def get_sequence_parallel_group():
    return _require("sp_group")


def get_sequence_parallel_world_size():
    return _require("sp_size")


def get_sequence_parallel_rank():
    return _require("rank") % _require("sp_size")


def get_sequence_data_parallel_group():
    return _require("sdp_group")


def get_sequence_data_parallel_world_size():
    return _require("world")


def get_sequence_data_parallel_rank():
    return _require("rank")


# The engine's data-parallel group: see the module docstring.
get_data_parallel_group = get_sequence_data_parallel_group
get_data_parallel_world_size = get_sequence_data_parallel_world_size
get_data_parallel_rank = get_sequence_data_parallel_rank


def get_pure_data_parallel_group():
    """Ranks holding the same sequence slice of different samples."""
    return _require("dp_group")


def get_pure_data_parallel_world_size():
    return _require("world") // _require("sp_size")


def get_pure_data_parallel_rank():
    return _require("rank") // _require("sp_size")


def get_model_parallel_world_size():
    return 1


def get_model_parallel_rank():
    return 0


def get_model_parallel_group():
    """This rank alone: Ulysses has no tensor parallelism (activation checkpointing's
    partition_activations therefore keeps whole tensors)."""
    return _require("mp_group")
