"""Upstream path of the 1-bit optimizers: ``deepspeed.runtime.fp16.onebit`` (re-exports ``deepspeed.onebit``)."""
from deepspeed.onebit import OneBitAdam, OnebitAdam, OneBitLamb, OnebitLamb, ZeroOneAdam  # noqa: F401
