"""Compatibility paths (`deepspeed.runtime.*`) that the DeepSpeed docs and the Hugging Face
integration import. Each module here only re-exports the real home; add a path only when a
documented import needs it, and list it in tests/core/test_compat_paths.py."""
import importlib


def __getattr__(name):
    """``deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES`` after a bare ``import deepspeed``
    (Accelerate reads it that way): submodules load on first attribute access."""
    try:
        value = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module '{__name__}' has no attribute '{name}'") from None
    globals()[name] = value
    return value
