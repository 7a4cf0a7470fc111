"""Small shared helpers (`deepspeed.utils`)."""
import importlib

from deepspeed.utils.lazy_exports import plugin_exports
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

__all__ = ["logger", "log_dist", "RepeatingLoader", "safe_get_full_fp32_param", "safe_get_full_grad",
           "safe_get_full_optimizer_state", "safe_set_full_fp32_param",
           "safe_set_full_optimizer_state", "safe_get_local_fp32_param", "safe_get_local_grad",
           "safe_get_local_optimizer_state", "safe_set_local_fp32_param",
           "safe_set_local_optimizer_state", "groups", "is_initialized"]


def is_initialized() -> bool:
    """Whether DeepSpeed's process group is up (what ``deepspeed.comm.is_initialized`` says);
    here because Transformers asks ``deepspeed.utils.is_initialized()``. Asked of
    ``torch.distributed`` directly: ``deepspeed.comm`` sits above this package (it logs
    through it)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def __getattr__(name):
    """Names installed plugins export into this package (``set_z3_leaf_modules`` is ZeRO's:
    ``lazy_exports.plugin_exports``), else a submodule (``deepspeed.utils.groups``, which the
    topology installs here, or a plugin's upstream-path module) after a bare
    ``import deepspeed``, loaded on first use: importing one here would point this floor up at
    ``deepspeed.comm``."""
    if not name.startswith("__") and name not in __dir__():
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    return _plugin_names(name)


_plugin_names, __dir__ = plugin_exports(__name__)
