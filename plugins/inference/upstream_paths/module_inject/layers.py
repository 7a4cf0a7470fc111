"""``deepspeed.module_inject.layers`` (upstream path) -> ``deepspeed.inference.layers``."""
from deepspeed.inference.layers import LinearAllreduce, LinearLayer  # noqa: F401
