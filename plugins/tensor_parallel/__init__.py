"""``deepspeed.tensor_parallel``: AutoTP tensor-parallel *training*.

``deepspeed.tp_model_init(model, tp_size, dtype)`` (or ``"tensor_parallel": {"autotp_size": N}``
in the training config) splits each transformer block of a Hugging Face-style model over
``tp_size`` ranks with the inference plugin's AutoTP, in layers that train
(``layers``: column- / row-parallel Linears and the two autograd communication ops); the
tensor x data parallel groups are ``deepspeed.utils.groups.TensorParallelGroups``. ``shard``
does the split, ``gather`` rebuilds the unsplit weights for 16-bit saves, ``plugin`` wires it
into the engine.

It lives apart from ``deepspeed.inference`` because it is a *training* feature: it owns a
training-config section and takes part in the engine's step, ZeRO and checkpoints, none of
which an inference engine has; it uses the inference plugin only through AutoTP's public
functions (``AutoTP``, ``policy_from_injection``, ``shard_model``) and layer classes.
"""
from deepspeed.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                              copy_to_tensor_parallel,
                                              reduce_from_tensor_parallel)
from deepspeed.tensor_parallel.shard import split_of, tp_model_init

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "copy_to_tensor_parallel",
           "reduce_from_tensor_parallel", "split_of", "tp_model_init"]
