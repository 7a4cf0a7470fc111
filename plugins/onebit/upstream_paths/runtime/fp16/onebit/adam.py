"""Upstream path ``deepspeed.runtime.fp16.onebit.adam``."""
from deepspeed.onebit.adam import OneBitAdam, OnebitAdam  # noqa: F401
