"""Upstream path ``deepspeed.runtime.fp16.onebit.zoadam``."""
from deepspeed.onebit.zoadam import ZeroOneAdam  # noqa: F401
