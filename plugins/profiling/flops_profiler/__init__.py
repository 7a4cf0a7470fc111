"""``deepspeed.profiling.flops_profiler``: per-module flops, MACs, params and latency."""
from deepspeed.profiling.flops_profiler.model_profile import get_model_profile
from deepspeed.profiling.flops_profiler.profiler import FlopsProfiler
from deepspeed.profiling.flops_profiler.units import (duration_to_string, flops_to_string,
                                                      macs_to_string, number_to_string,
                                                      params_to_string)

__all__ = ["FlopsProfiler", "get_model_profile", "number_to_string", "macs_to_string",
           "flops_to_string", "params_to_string", "duration_to_string"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
