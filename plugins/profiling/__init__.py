"""``deepspeed.profiling``: the flops profiler and PyTorch-profiler helpers."""

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# the package API other plugins import (deepspeed.plan counts FLOPs on the meta device)
_EXPORTS = {
    "FlopsProfiler": "deepspeed.profiling.flops_profiler.profiler",
    "get_model_profile": "deepspeed.profiling.flops_profiler.model_profile",
}

__all__ = sorted(_EXPORTS)

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
