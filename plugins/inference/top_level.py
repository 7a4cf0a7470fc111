"""The inference names upstream binds at the top level of ``deepspeed``: ``deepspeed.InferenceEngine``,
the type ``deepspeed.init_inference`` returns.

The core imports no plugin, so this module is listed in pyproject.toml under the entry-point
group ``deepspeed.exports`` and ``deepspeed``'s ``__getattr__`` reads it on first use
(``deepspeed.utils.lazy_exports.plugin_exports``); the engine itself loads only then.
"""
from deepspeed.utils.lazy_exports import lazy_exports

_EXPORTS = {"InferenceEngine": "deepspeed.inference.engine"}

__all__ = ["InferenceEngine"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
