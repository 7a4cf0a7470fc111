"""``deepspeed.inference.sharding``: how a tensor-parallel rank's slice of a tensor is chosen and
remembered, which the ``tensor_parallel`` plugin owns; this module keeps the older path."""
from deepspeed.tensor_parallel import (CHECKPOINT_KEY, SHARD_FN, frozen,  # noqa: F401
                                       mark, narrow_fn, parameter_bytes, replace_everywhere,
                                       shard_of, shard_range, shard_sizes, take_shard)
