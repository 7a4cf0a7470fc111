"""DeepSpeed: a slim training engine whose features arrive as pluggy plugins.

The public entry points are attributes of this package, so `import deepspeed` is all a user
script needs. They load lazily (PEP 562): the `deepspeed` launcher, `ds_report` and plugin
packages import `deepspeed.<sub>` without paying for the engine's imports.
"""
import importlib

from deepspeed.hooks import hookimpl
from deepspeed.version import __version__, version

# public name -> module that defines it
_LAZY = {
    "initialize": "deepspeed.api",
    "add_config_arguments": "deepspeed.api",
    "tp_model_init": "deepspeed.api",
    "init_inference": "deepspeed.api",
    "init_distributed": "deepspeed.comm",
    "DeepSpeedEngine": "deepspeed.engine",
    "DeepSpeedConfig": "deepspeed.config",
    "DeepSpeedPlugin": "deepspeed.plugin_manager",
    "get_accelerator": "deepspeed.accelerator",
    "OnDevice": "deepspeed.utils.init_on_device",
    "DeepSpeedTransformerConfig": "deepspeed.ops.transformer",
    "DeepSpeedTransformerLayer": "deepspeed.ops.transformer",
}

__all__ = ["__version__", "version", "hookimpl", *_LAZY]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        # `deepspeed.comm`, `deepspeed.zero`, ... reachable after a bare `import deepspeed`
        try:
            value = importlib.import_module(f"deepspeed.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"deepspeed.{name}":
                raise
            raise AttributeError(f"module 'deepspeed' has no attribute '{name}'") from None
        globals()[name] = value
        return value
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
