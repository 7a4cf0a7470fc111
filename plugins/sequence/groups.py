"""Upstream's names for the sequence-parallel groups in ``deepspeed.utils.groups``
(``_get_sequence_parallel_group()`` ...; registered under the entry-point group
``deepspeed.exports.utils.groups``): views onto the current topology, answered by its
model-parallel unit (``parallel_state`` registers itself as one, a user's Megatron ``mpu``
may answer too) or its sequence dimensions."""
from deepspeed import topology

HINT = ("sequence parallelism is not configured in this run (sequence_parallel_size is 1). "
        "Register a model-parallel unit that provides it with deepspeed.initialize(mpu=...) or "
        "deepspeed.utils.groups.set_mpu(...)")


def _get_sequence_parallel_group():
    """The ranks that each hold a slice of the same sequences (Ulysses)."""
    return topology.current().group("sequence", hint=HINT)


def _get_sequence_parallel_world_size():
    return topology.current().size("sequence")


def _get_sequence_parallel_rank():
    return topology.current().rank("sequence")


def _answers_sequence_data():
    current = topology.current()
    return (current.built("sequence_data") is not None
            or getattr(current.unit, "get_sequence_data_parallel_group", None) is not None)


def _get_sequence_data_parallel_group():
    """Sequence x data parallel ranks: the group gradients are averaged over when sequence
    parallelism splits a sample across ranks. Without sequence parallelism it is the
    data-parallel group."""
    name = "sequence_data" if _answers_sequence_data() else "data"
    return topology.current().group(name)


def _get_sequence_data_parallel_world_size():
    name = "sequence_data" if _answers_sequence_data() else "data"
    return topology.current().size(name)


def _get_sequence_data_parallel_rank():
    name = "sequence_data" if _answers_sequence_data() else "data"
    return topology.current().rank(name)


__all__ = ["_get_sequence_parallel_group", "_get_sequence_parallel_world_size",
           "_get_sequence_parallel_rank", "_get_sequence_data_parallel_group",
           "_get_sequence_data_parallel_world_size", "_get_sequence_data_parallel_rank"]
