"""``deepspeed.tensor_parallel``: tensor parallelism, for training and for inference.

It owns everything tensor parallel the other plugins build on: the tensor x data parallel
layout of the topology and its model-parallel unit (``groups``: ``TensorParallelGroups``,
``init_tensor_parallel_groups``), the split Linear layers (``layers``: the inference pair
``LinearLayer`` / ``LinearAllreduce`` and the training pair ``ColumnParallelLinear`` /
``RowParallelLinear`` with the two autograd communication ops), how a rank's slice of a tensor
is chosen and remembered (``sharding``), and AutoTP, which finds the Linears of each transformer
block to split (``auto_tp``). ``deepspeed.tp_model_init(model, tp_size, dtype)`` (or
``"tensor_parallel": {"autotp_size": N}`` in the training config) splits a Hugging Face-style
model for training (``shard``); ``gather`` rebuilds the unsplit weights for 16-bit saves,
``plugin`` wires it into the engine.

The inference plugin (``init_inference``'s AutoTP) and Domino use it through the names below
only; they load on first use, so a run that enables neither pays nothing for them.
"""
from deepspeed.utils.lazy_exports import lazy_exports

_LAYERS, _SHARDING = "deepspeed.tensor_parallel.layers", "deepspeed.tensor_parallel.sharding"
_AUTO_TP, _GROUPS = "deepspeed.tensor_parallel.auto_tp", "deepspeed.tensor_parallel.groups"
_EXPORTS = {
    **dict.fromkeys(("ColumnParallelLinear", "RowParallelLinear", "LinearLayer",
                     "LinearAllreduce", "SplitLinear", "copy_to_tensor_parallel",
                     "reduce_from_tensor_parallel", "TENSOR_MODEL_PARALLEL", "PARTITION_DIM"),
                    _LAYERS),
    **dict.fromkeys(("CHECKPOINT_KEY", "SHARD_FN", "frozen", "mark", "narrow_fn",
                     "parameter_bytes", "replace_everywhere", "shard_of", "shard_range",
                     "shard_sizes", "take_shard"), _SHARDING),
    **dict.fromkeys(("AutoTP", "TensorParallelError", "policy_from_injection", "shard_block",
                     "shard_model"), _AUTO_TP),
    **dict.fromkeys(("TensorParallelGroups", "init_tensor_parallel_groups"), _GROUPS),
    "split_of": "deepspeed.tensor_parallel.shard",
    "tp_model_init": "deepspeed.tensor_parallel.shard",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
