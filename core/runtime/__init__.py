"""Compatibility paths (`deepspeed.runtime.*`) that the DeepSpeed docs and the Hugging Face
integration import. Each module here only re-exports the real home; add a path only when a
documented import needs it, and list it in tests/core/test_compat_paths.py."""
from deepspeed.utils.lazy_exports import lazy_exports

# ``deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES`` after a bare ``import deepspeed``
# (Accelerate reads it that way): submodules load on first attribute access
__getattr__, __dir__ = lazy_exports(__name__)
