"""Small shared helpers (`deepspeed.utils`)."""
import importlib
from deepspeed.utils.logging import log_dist, logger
from deepspeed.utils.repeating_loader import RepeatingLoader
from deepspeed.utils.tensor_fragment import (safe_get_full_fp32_param, safe_get_full_grad,
                                             safe_get_full_optimizer_state,
                                             safe_get_local_fp32_param, safe_get_local_grad,
                                             safe_get_local_optimizer_state,
                                             safe_set_full_fp32_param,
                                             safe_set_full_optimizer_state,
                                             safe_set_local_fp32_param,
                                             safe_set_local_optimizer_state)
from deepspeed.utils.z3_leaf_module import (get_z3_leaf_modules, set_z3_leaf_modules,
                                            unset_z3_leaf_modules, z3_leaf_module,
                                            z3_leaf_parameter)

__all__ = ["logger", "log_dist", "RepeatingLoader", "safe_get_full_fp32_param", "safe_get_full_grad",
           "safe_get_full_optimizer_state", "safe_set_full_fp32_param",
           "safe_set_full_optimizer_state", "safe_get_local_fp32_param", "safe_get_local_grad",
           "safe_get_local_optimizer_state", "safe_set_local_fp32_param",
           "safe_set_local_optimizer_state", "groups", "is_initialized", "set_z3_leaf_modules",
           "unset_z3_leaf_modules", "get_z3_leaf_modules", "z3_leaf_module", "z3_leaf_parameter"]


def is_initialized() -> bool:
    """Whether DeepSpeed's process group is up (``deepspeed.comm.is_initialized``); here because
    Transformers asks ``deepspeed.utils.is_initialized()``. Imported lazily: ``deepspeed.comm``
    itself imports this package's logger."""
    from deepspeed import comm

    return comm.is_initialized()


def __getattr__(name):
    """``deepspeed.utils.groups`` after a bare ``import deepspeed``, loaded on first use for the
    same import-cycle reason as ``is_initialized``."""
    if name == "groups":
        return importlib.import_module(f"{__name__}.groups")
    raise AttributeError(f"module '{__name__}' has no attribute '{name}'")
