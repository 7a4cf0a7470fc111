"""Upstream path ``deepspeed.runtime.fp16.onebit.lamb``."""
from deepspeed.onebit.lamb import OneBitLamb, OnebitLamb  # noqa: F401
