"""``deepspeed.inference.layers``: the tensor-parallel Linears AutoTP puts in place of
``nn.Linear``, which the ``tensor_parallel`` plugin owns; this module keeps the older path."""
from deepspeed.tensor_parallel import LinearAllreduce, LinearLayer  # noqa: F401
