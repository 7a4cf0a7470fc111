"""``deepspeed.zero``: the Zero Redundancy Optimizer plugin.

Stages 1 and 2 (optimizer state and gradients partitioned over the data-parallel ranks, with
optional CPU / NVMe offload of the optimizer) are in ``stage_1_and_2``; where each element lives
is in ``partition``; the config models in ``config`` / ``offload_config`` / ``aio_config``; the
memory estimators in ``estimators``. The plugin class that hooks it into the engine is
``plugin.ZeroPlugin`` (entry point ``zero``). Names are imported lazily so that reading the
config schema does not import the optimizer machinery.
"""
from deepspeed.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "DeepSpeedZeroConfig": "deepspeed.zero.config",
    "ZeroStageEnum": "deepspeed.zero.config",
    "DeepSpeedZeroOffloadOptimizerConfig": "deepspeed.zero.offload_config",
    "DeepSpeedZeroOffloadParamConfig": "deepspeed.zero.offload_config",
    "OffloadDeviceEnum": "deepspeed.zero.offload_config",
    "DeepSpeedZeroOptimizer": "deepspeed.zero.stage_1_and_2",
    "Init": "deepspeed.zero.partition_parameters",
    "ZeroParamStatus": "deepspeed.zero.partition_parameters",
    "GatheredParameters": "deepspeed.zero.gathered_parameters",
    "MiCS_Init": "deepspeed.zero.mics",
    "TiledLinear": "deepspeed.zero.tiling",
    "TiledLinearReturnBias": "deepspeed.zero.tiling",
    "register_external_parameter": "deepspeed.zero.stage3",
    "unregister_external_parameter": "deepspeed.zero.stage3",
    "unwrap_model_for_generation": "deepspeed.zero.generation",
    "estimate_zero2_model_states_mem_needs_all_live": "deepspeed.zero.estimators",
    "estimate_zero2_model_states_mem_needs_all_cold": "deepspeed.zero.estimators",
    "estimate_zero3_model_states_mem_needs_all_live": "deepspeed.zero.estimators",
    "estimate_zero3_model_states_mem_needs_all_cold": "deepspeed.zero.estimators",
    # the per-process figures behind those tables and the parameter count they use (read by
    # deepspeed.plan, so that its model-state numbers are the estimators' own)
    "estimate_zero2_model_states_mem_needs": "deepspeed.zero.estimators",
    "estimate_zero3_model_states_mem_needs": "deepspeed.zero.estimators",
    "model_param_counts": "deepspeed.zero.estimators",
    # the rule ZeRO cuts its buckets by (deepspeed.plan predicts message sizes with it)
    "bucket_runs": "deepspeed.zero.partition",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
