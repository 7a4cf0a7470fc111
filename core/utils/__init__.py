"""Small shared helpers (`deepspeed.utils`).

The launcher's per-node process (`deepspeed.launcher.launch`) and the rank guard log through this
package and never touch a tensor, so importing it must not import torch (seconds of CPU in every
launched job): the tensor helpers load on first use (PEP 562). The ZeRO-3 leaf-module helpers load
eagerly (their module imports no torch): the function `z3_leaf_module` shares its module's name,
and a lazy binding would lose to the submodule once anything imported it."""
import importlib

from deepspeed.utils.logging import log_dist, logger
from deepspeed.utils.z3_leaf_module import (get_z3_leaf_modules, set_z3_leaf_modules,
                                            unset_z3_leaf_modules, z3_leaf_module,
                                            z3_leaf_parameter)

# public name -> module that defines it, imported on first access
_LAZY = {  # a plain literal: the docs build reads it statically (tools/docs/griffe_lazy_exports.py)
    "RepeatingLoader": "deepspeed.utils.repeating_loader",
    "safe_get_full_fp32_param": "deepspeed.utils.tensor_fragment",
    "safe_get_full_grad": "deepspeed.utils.tensor_fragment",
    "safe_get_full_optimizer_state": "deepspeed.utils.tensor_fragment",
    "safe_get_local_fp32_param": "deepspeed.utils.tensor_fragment",
    "safe_get_local_grad": "deepspeed.utils.tensor_fragment",
    "safe_get_local_optimizer_state": "deepspeed.utils.tensor_fragment",
    "safe_set_full_fp32_param": "deepspeed.utils.tensor_fragment",
    "safe_set_full_optimizer_state": "deepspeed.utils.tensor_fragment",
    "safe_set_local_fp32_param": "deepspeed.utils.tensor_fragment",
    "safe_set_local_optimizer_state": "deepspeed.utils.tensor_fragment",
}

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
    """The tensor helpers above, and ``deepspeed.utils.groups`` after a bare ``import deepspeed``
    (lazy for the same import-cycle reason as ``is_initialized``), loaded on first use."""
    if name == "groups":
        return importlib.import_module(f"{__name__}.groups")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module '{__name__}' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
