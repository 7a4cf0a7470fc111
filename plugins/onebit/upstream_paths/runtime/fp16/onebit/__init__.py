"""Upstream path of the 1-bit optimizers: ``deepspeed.runtime.fp16.onebit`` (re-exports ``deepspeed.onebit``)."""
from deepspeed.onebit import OneBitAdam, OnebitAdam, OneBitLamb, OnebitLamb, ZeroOneAdam  # noqa: F401

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
