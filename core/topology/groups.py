"""Upstream's ``deepspeed.utils.groups``: which ranks a tensor is shared or split across, asked
by the names integrations use (Accelerate and Transformers call
``groups._get_sequence_parallel_group()`` and friends, so the names keep their leading
underscores).

Every function here is a view onto ``deepspeed.topology.current()`` (the live engine's topology,
else the process's): nothing is stored in this module. The core answers the two dimensions it
owns, "data" and "model", from the registered model-parallel unit (``set_mpu``, or the engine's
``mpu``; without one the data-parallel group is the world and the model-parallel size 1).
Names of a feature's groups (``_get_expert_parallel_group``, ``get_tensor_model_parallel_group``,
``_get_sequence_parallel_group``, ``initialize(ep_size, mpu)`` ...) are contributed by the
plugin that owns the feature: each lists a module under the entry-point group
``deepspeed.exports.utils.groups``, whose ``__all__`` names this module's ``__getattr__``
resolves on first use (``deepspeed.utils.lazy_exports.plugin_exports``). ``groups.mpu`` is
the current topology's unit, read afresh on every access.

A group that does not exist is an error, never ``None``: ``None`` means "the world" to
``torch.distributed``, and a collective silently run over the world instead of a sub-group gives
wrong numbers rather than a failure.
"""
from deepspeed import comm as dist
from deepspeed import topology
from deepspeed.utils.lazy_exports import plugin_exports

UPSTREAM_NAME = "deepspeed.utils.groups"


def set_mpu(unit):
    """Register the model-parallel unit whose groups the getters report (``None`` clears it)
    on the current topology. Returns the previous one so a caller can restore it."""
    return topology.set_unit(unit)


# ---------------------------------------------------------------- data parallel
def _get_data_parallel_group():
    """The ranks that hold replicas (or ZeRO shards) of the same parameters."""
    return topology.current().group("data")


def _get_data_parallel_world_size():
    return topology.current().size("data")


def _get_data_parallel_rank():
    return topology.current().rank("data")


def _get_broadcast_src_rank():
    """Global rank of the first member of this rank's data-parallel group."""
    return dist.get_global_rank(_get_data_parallel_group(), 0)


# ---------------------------------------------------------------- model parallel
MODEL_PARALLEL_HINT = ("model parallelism is not configured in this run (the model-parallel "
                       "world size is 1). Register a model-parallel unit that provides it with "
                       "deepspeed.initialize(mpu=...) or deepspeed.utils.groups.set_mpu(...)")


def _get_model_parallel_group():
    """The ranks that together hold one copy of the model."""
    return topology.current().group("model", hint=MODEL_PARALLEL_HINT)


def _get_model_parallel_world_size():
    return topology.current().size("model")


def _get_model_parallel_rank():
    return topology.current().rank("model")


__getattr__, __dir__ = plugin_exports(__name__, dynamic={"mpu": lambda: topology.current().unit},
                                      upstream=UPSTREAM_NAME)
