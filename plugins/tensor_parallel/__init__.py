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

_EXPORTS = {  # a plain literal: the docs build reads it statically (tools/docs/griffe_lazy_exports.py)
    "ColumnParallelLinear": "deepspeed.tensor_parallel.layers",
    "RowParallelLinear": "deepspeed.tensor_parallel.layers",
    "LinearLayer": "deepspeed.tensor_parallel.layers",
    "LinearAllreduce": "deepspeed.tensor_parallel.layers",
    "SplitLinear": "deepspeed.tensor_parallel.layers",
    "copy_to_tensor_parallel": "deepspeed.tensor_parallel.layers",
    "reduce_from_tensor_parallel": "deepspeed.tensor_parallel.layers",
    "TENSOR_MODEL_PARALLEL": "deepspeed.tensor_parallel.layers",
    "PARTITION_DIM": "deepspeed.tensor_parallel.layers",
    "CHECKPOINT_KEY": "deepspeed.tensor_parallel.sharding",
    "SHARD_FN": "deepspeed.tensor_parallel.sharding",
    "FUSED_BLOCKS": "deepspeed.tensor_parallel.sharding",
    "frozen": "deepspeed.tensor_parallel.sharding",
    "fused_narrow_fn": "deepspeed.tensor_parallel.sharding",
    "mark": "deepspeed.tensor_parallel.sharding",
    "narrow_fn": "deepspeed.tensor_parallel.sharding",
    "parameter_bytes": "deepspeed.tensor_parallel.sharding",
    "replace_everywhere": "deepspeed.tensor_parallel.sharding",
    "shard_of": "deepspeed.tensor_parallel.sharding",
    "shard_range": "deepspeed.tensor_parallel.sharding",
    "shard_sizes": "deepspeed.tensor_parallel.sharding",
    "take_shard": "deepspeed.tensor_parallel.sharding",
    "AutoTP": "deepspeed.tensor_parallel.auto_tp",
    "TensorParallelError": "deepspeed.tensor_parallel.auto_tp",
    "policy_from_injection": "deepspeed.tensor_parallel.auto_tp",
    "shard_block": "deepspeed.tensor_parallel.auto_tp",
    "shard_model": "deepspeed.tensor_parallel.auto_tp",
    "TensorParallelGroups": "deepspeed.tensor_parallel.groups",
    "init_tensor_parallel_groups": "deepspeed.tensor_parallel.groups",
    "split_of": "deepspeed.tensor_parallel.shard",
    "tp_model_init": "deepspeed.tensor_parallel.shard",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
