"""Small shared helpers (`deepspeed.utils`).

The launcher's per-node process (`deepspeed.launcher.launch`) and the rank guard log through this
package and never touch a tensor, so importing it must not import torch (seconds of CPU in every
launched job): the tensor helpers load on first use (PEP 562). Names a plugin owns
(``set_z3_leaf_modules`` is ZeRO's) come from the installed plugins' exports
(``lazy_exports.plugin_exports``), so this floor imports no plugin."""
import importlib
import sys
import types

from deepspeed.utils.lazy_exports import import_submodule, plugin_exports
from deepspeed.utils.logging import log_dist, logger

# public name -> module that defines it, imported on first access
_LAZY = {  # a plain literal: the docs build reads it statically (tools/docs/griffe_lazy_exports.py)
    "OnDevice": "deepspeed.utils.init_on_device",
    "RepeatingLoader": "deepspeed.utils.repeating_loader",
    "safe_get_full_fp32_param": "deepspeed.utils.tensor_fragment",
    "safe_get_full_grad": "deepspeed.utils.tensor_fragment",
    "safe_get_full_optimizer_state": "deepspeed.utils.tensor_fragment",
    "safe_get_local_fp32_param": "deepspeed.utils.tensor_fragment",
    "safe_get_local_grad": "deepspeed.utils.tensor_fragment",
    "safe_get_local_optimizer_state": "deepspeed.utils.tensor_fragment",
    "safe_set_full_fp32_param": "deepspeed.utils.tensor_fragment",
    "safe_set_full_grad": "deepspeed.utils.tensor_fragment",
    "safe_set_full_optimizer_state": "deepspeed.utils.tensor_fragment",
    "safe_set_local_fp32_param": "deepspeed.utils.tensor_fragment",
    "safe_set_local_grad": "deepspeed.utils.tensor_fragment",
    "safe_set_local_optimizer_state": "deepspeed.utils.tensor_fragment",
}

__all__ = ["logger", "log_dist", "OnDevice", "RepeatingLoader", "safe_get_full_fp32_param", "safe_get_full_grad",
           "safe_get_full_optimizer_state", "safe_set_full_fp32_param",
           "safe_set_full_optimizer_state", "safe_get_local_fp32_param", "safe_get_local_grad",
           "safe_get_local_optimizer_state", "safe_set_local_fp32_param",
           "safe_set_local_optimizer_state", "safe_set_full_grad", "safe_set_local_grad",
           "groups", "is_initialized"]


def is_initialized() -> bool:
    """Whether DeepSpeed's process group is up (what ``deepspeed.comm.is_initialized`` says);
    here because Transformers asks ``deepspeed.utils.is_initialized()``. Asked of
    ``torch.distributed`` directly: ``deepspeed.comm`` sits above this package (it logs
    through it)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def __getattr__(name):
    """In order: the tensor helpers of ``_LAZY``; a submodule (``deepspeed.utils.groups``, which
    the topology installs here, or a plugin's upstream-path module) after a bare
    ``import deepspeed``; a name an installed plugin exports here (``z3_leaf_module`` is both a
    ZeRO upstream-path module and its function: the function wins, as upstream binds it last).
    All load on first use: importing them here would point this floor up at
    ``deepspeed.comm`` and torch."""
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name not in __dir__():
        submodule = import_submodule(__name__, name)
        if submodule is not None:
            return submodule
    return _plugin_names(name)


_plugin_names, _exported_dir = plugin_exports(__name__)


def __dir__():
    return sorted(set(_exported_dir()) | set(_LAZY))


class _PackageWhereExportsWin(types.ModuleType):
    """``deepspeed.utils`` itself. Importing a submodule binds it as an attribute of its package
    *after* the submodule ran; for ZeRO's upstream-path module ``deepspeed.utils.z3_leaf_module``
    that would replace the function of the same name, which upstream binds last. A submodule
    that says so (``EXPORTED_NAME_WINS = True``) leaves the plugin-exported name in place."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and getattr(value, "EXPORTED_NAME_WINS", False):
            value = _plugin_names(name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _PackageWhereExportsWin
