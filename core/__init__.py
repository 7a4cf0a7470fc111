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
        # `deepspeed.comm`, `deepspeed.zero`, ... reachable after a bare `import deepspeed`,
        # then the names installed plugins export at the top level (`deepspeed.InferenceEngine`)
        from deepspeed.utils.lazy_exports import import_submodule

        value = import_submodule("deepspeed", name)
        if value is None:
            return _plugin_names()(name)
        globals()[name] = value
        return value
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


_plugin_exports = []  # (__getattr__, __dir__) of the plugins' top-level names, made on first use


def _plugin_names(which=0):
    """``__getattr__`` (``which=1``: ``__dir__``) over the names installed plugins export into
    ``deepspeed`` itself (entry-point group ``deepspeed.exports``, see
    ``deepspeed.utils.lazy_exports``)."""
    if not _plugin_exports:
        from deepspeed.utils.lazy_exports import plugin_exports

        _plugin_exports.extend(plugin_exports(__name__))
    return _plugin_exports[which]


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_plugin_names(1)()))
