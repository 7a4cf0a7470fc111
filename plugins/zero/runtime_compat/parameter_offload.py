"""``deepspeed.runtime.zero.parameter_offload`` (upstream path): ``DeepSpeedZeRoOffload``, which
runs a module under ZeRO-3 parameter partitioning without a training engine (inference, or a
frozen reference model next to a trained one).

Constructing it partitions the module's parameters that are not partitioned yet (over
``dp_process_group``, on ``offload_param_config.device`` when that is ``"cpu"``), marks the small
ones persistent, and installs the gather/release hooks the engine's ZeRO-3 uses
(``deepspeed.zero.stage3.ParameterCoordinator``), so ``module(x)`` works on shards.
"""
import sys

from deepspeed.zero.partition_parameters import (Init, apply_persistence, by_partitioner,
                                                 is_zero_param)
from deepspeed.zero.stage3 import ParameterCoordinator

# arguments of upstream's constructor this class cannot honour, with their no-op values
_UNSUPPORTED = {"zero_param_parallel_group": None, "zero_quantized_weights": False,
                "zero_quantized_nontrainable_weights": False,
                "zero_module_granularity_threshold": 0}


class DeepSpeedZeRoOffload:
    """ZeRO-3 parameter partitioning for ``module`` without an engine (module docstring).
    ``timers``, ``ds_config``, ``overlap_comm`` (gathers always overlap through prefetch),
    ``mpu`` and ``log_trace_cache_warnings`` are accepted for upstream's signature."""

    def __init__(self, module, timers=None, ds_config=None, overlap_comm=True,
                 prefetch_bucket_size=50_000_000, max_reuse_distance=1_000_000_000,
                 max_live_parameters=1_000_000_000, param_persistence_threshold=100_000,
                 model_persistence_threshold=sys.maxsize, dp_process_group=None,
                 offload_param_config=None, mpu=None, log_trace_cache_warnings=False,
                 **unsupported):
        for name, value in unsupported.items():
            if name not in _UNSUPPORTED:
                raise TypeError(f"DeepSpeedZeRoOffload() got an unexpected keyword argument "
                                f"'{name}'")
            if value != _UNSUPPORTED[name]:
                raise ValueError(f"DeepSpeedZeRoOffload({name}={value!r}) is not supported; "
                                 f"use deepspeed.initialize with that zero_optimization key")
        self.module = module
        device = getattr(offload_param_config, "device", None)
        device = getattr(device, "value", device)
        if any(not is_zero_param(p) for p in module.parameters()):
            Init(module=module, data_parallel_group=dp_process_group,
                 remote_device="cpu" if device == "cpu" else None)
        self.mark_persistent_parameters(param_persistence_threshold, model_persistence_threshold)
        self.param_coordinator = ParameterCoordinator(
            module, prefetch_bucket_size, max_live_parameters, max_reuse_distance).install()

    def mark_persistent_parameters(self, param_threshold, model_threshold):
        """Keep parameters below ``param_threshold`` elements whole once gathered, at most
        ``model_threshold`` elements in all; returns how many elements persist."""
        params = [p for p in self.module.parameters() if is_zero_param(p)]
        return apply_persistence(params, param_threshold, model_threshold)

    def get_param_coordinator(self):
        return self.param_coordinator

    def empty_partition_cache(self):
        """Release every gathered parameter, persistent ones included (they are gathered again
        when next used)."""
        params = [p for p in self.module.parameters() if is_zero_param(p)]
        for partitioner, own in by_partitioner(params):
            partitioner.release(own, force=True)

    def destroy(self):
        """Detach the hooks (the parameters stay partitioned)."""
        self.param_coordinator.remove()


__all__ = ["DeepSpeedZeRoOffload"]
