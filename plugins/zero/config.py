"""`zero_optimization`: the ZeRO section of the DeepSpeed config (`DeepSpeedZeroConfig`).

Keys, defaults and aliases follow the DeepSpeed 0.14 docs. Beyond plain field checks this model
owns the rules that involve several keys, so the optimizer code can trust a validated config:

* renamed keys keep working with a warning (`cpu_offload`, `cpu_offload_param`,
  `cpu_offload_use_pin_memory`, `stage3_gather_fp16_weights_on_model_save`); an old key together
  with its replacement is an error naming both;
* the ZeRO-3 knobs accept their historical `stage3_` spellings as aliases;
* `"auto"` left in an integer knob (the HF Trainer leaves it when it cannot fill it) means the
  documented default; a fractional value (HF computes `0.9 * hidden**2`) is truncated with a
  warning instead of failing;
* `overlap_comm` unset means "on for stage 3 only";
* `offload_param` and partial optimizer offload (`ratio < 1`) need stage 3;
* the legacy boolean form `"zero_optimization": true/false` means stage 1/0.
"""
import math
import os
import sys
import warnings
from enum import IntEnum
from typing import Annotated, Any, Optional

import pydantic
from pydantic import Field, field_validator, model_validator

import deepspeed.config

from deepspeed.config.errors import ConfigDeprecationWarning
from deepspeed.config.model import AUTO, DeepSpeedConfigModel, deprecated_alias
from deepspeed.utils.logging import logger

from .aio_config import AioConfig
from .offload_config import (DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig,
                             OffloadDeviceEnum)
from .zenflow.config import ZenFlowConfig

__all__ = ["ZeroStageEnum", "DeepSpeedZeroConfig", "from_legacy_bool"]


_SKIPPED_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) for m in (pydantic, deepspeed.config)) + (
    os.path.dirname(os.path.abspath(__file__)),)


def _user_stacklevel() -> int:
    """Stack level of the first frame outside pydantic, the config core and this plugin, so a
    warning points at the code that built the config."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_SKIPPED_DIRS):
        frame, level = frame.f_back, level + 1
    return level


class ZeroStageEnum(IntEnum):
    """What ZeRO partitions across data-parallel ranks; each stage adds to the previous one."""

    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


def _cpu_offload_section(on: Any) -> Any:
    """Old boolean `cpu_offload*` flags become the `{device: cpu}` sub-section they stood for."""
    if on is True:
        return {"device": OffloadDeviceEnum.cpu.value}
    if on is False or on is None:
        return None
    return on  # not a bool: let the sub-section validation report it


def _knob(default: int, alias: Optional[str] = None, description: str = "") -> Any:
    """A non-negative integer tuning knob that tolerates a leftover "auto" (see module doc)."""
    return Field(default, ge=0, alias=alias, description=description,
                 json_schema_extra={"accepts_auto": True})


# Integer knobs that may arrive as "auto" or as a fractional float from an integration.
Z = "tests/plugins/zero/"
C = Z + "test_zero_collective_keys.py::"

_INT_KNOBS = ("reduce_bucket_size", "allgather_bucket_size", "allgather_size", "sub_group_size",
              "prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold",
              "max_live_parameters", "max_reuse_distance", "zero_hpz_partition_size")


class DeepSpeedZeroConfig(DeepSpeedConfigModel):
    """`zero_optimization`: which ZeRO stage runs and how it buckets, overlaps and offloads."""

    # what each key does here (see deepspeed.config.model): the test that fails without it
    tested_by = {
        "stage": Z + "test_zero_training.py::test_stage_matches_reference",
        "contiguous_gradients": C + "test_contiguous_gradients_off_keeps_full_gradients_until_"
                                    "the_bucket_goes",
        "reduce_scatter": C + "test_reduce_scatter_and_multi_rank_allreduce_choose_the_gradient_"
                              "collective",
        "use_multi_rank_bucket_allreduce": C + "test_reduce_scatter_and_multi_rank_allreduce_"
                                               "choose_the_gradient_collective",
        "reduce_bucket_size": C + "test_allgather_and_bucket_keys_shape_the_collectives",
        "allgather_partitions": C + "test_allgather_and_bucket_keys_shape_the_collectives",
        "allgather_bucket_size": C + "test_allgather_and_bucket_keys_shape_the_collectives",
        "allgather_size": Z + "test_zero3_key_effects.py::test_allgather_size_is_the_legacy_name_"
                              "of_the_all_gather_bucket_size",
        "overlap_comm": C + "test_overlap_comm_makes_the_gradient_collectives_asynchronous",
        "load_from_fp32_weights": Z + "test_zero3_key_effects.py::test_load_from_fp32_weights_"
                                      "chooses_the_masters_source",
        "elastic_checkpoint": Z + "test_zero_checkpoint.py::test_elastic_checkpoint_"
                                  "repartitions_without_loss",
        "cpu_offload_use_pin_memory": Z + "test_zero_config.py::test_cpu_offload_param_and_pin_"
                                          "memory_mapping",
        "sub_group_size": Z + "test_zero_nvme_pipeline.py::test_pipeline_read_and_write_overlap_"
                              "io_with_the_step",
        "prefetch_bucket_size": Z + "test_zero3_key_effects.py::test_prefetch_bucket_size_bounds_"
                                    "how_far_ahead_parameters_are_gathered",
        "param_persistence_threshold": Z + "test_zero_stage3.py::test_small_parameters_persist",
        "model_persistence_threshold": Z + "test_zero3_key_effects.py::test_model_persistence_"
                                           "threshold_caps_what_stays_whole",
        "max_live_parameters": Z + "test_zero_stage3.py::test_max_live_parameters_bounds_"
                                   "prefetching",
        "max_reuse_distance": Z + "test_zero_reuse_distance.py::test_reuse_distance_saves_"
                                  "gathers_without_changing_numerics",
        "gather_16bit_weights_on_model_save": Z + "test_zero_stage3.py::test_checkpoint_resume_"
                                                  "and_16bit_save",
        "ignore_unused_parameters": Z + "test_zero_partitioning.py::test_unused_parameters_"
                                        "rejected_when_asked",
        "zero_hpz_partition_size": Z + "test_zeropp_training.py::test_hpz_backward_all_gathers_"
                                       "stay_inside_the_node",
        "zero_quantized_weights": Z + "test_zeropp_training.py::test_byte_counters_show_the_"
                                      "savings",
        "zero_quantized_nontrainable_weights": Z + "test_zeropp_mixz.py::test_frozen_weights_"
                                                   "are_stored_int8_and_the_rest_trains",
        "zero_quantized_gradients": Z + "test_zeropp_training.py::test_byte_counters_show_the_"
                                        "savings",
        "mics_shard_size": Z + "test_zero_mics.py::test_two_shards_of_four_ranks_train_like_the_"
                               "reference",
        "mics_hierarchical_params_gather": Z + "test_zero_mics.py::test_hierarchical_gather_is_"
                                               "two_hops_with_the_same_result",
        "memory_efficient_linear": Z + "test_zero3_memory.py::test_released_weights_are_freed_"
                                       "before_backward_and_shards_view_masters",
        # implemented with zero.Init's Module.apply (branch fidelity-names)
        "override_module_apply": Z + "test_zero_init_module_apply.py::test_module_apply_during_"
                                     "zero_init",
    }

    stage: ZeroStageEnum = ZeroStageEnum.disabled
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    reduce_bucket_size: int = _knob(500_000_000, description="elements reduced at a time")
    use_multi_rank_bucket_allreduce: bool = True
    allgather_partitions: bool = True
    allgather_bucket_size: int = _knob(500_000_000, description="elements all-gathered at a time")
    allgather_size: int = _knob(500_000_000, description="legacy name of allgather_bucket_size "
                                "(used when allgather_bucket_size is not given)")
    overlap_comm: Optional[bool] = Field(None, description="None: on for stage 3 only")
    load_from_fp32_weights: bool = True
    elastic_checkpoint: bool = False

    offload_param: Annotated[Optional[DeepSpeedZeroOffloadParamConfig],
                             deprecated_alias("cpu_offload_param", convert=_cpu_offload_section)] = None
    offload_optimizer: Annotated[Optional[DeepSpeedZeroOffloadOptimizerConfig],
                                 deprecated_alias("cpu_offload", convert=_cpu_offload_section)] = None
    cpu_offload_use_pin_memory: Optional[bool] = Field(
        None, description="deprecated: sets pin_memory of the configured offload sections")
    aio: Optional[AioConfig] = Field(None, description="the docs' nested location of the `aio` section")

    sub_group_size: int = _knob(1_000_000_000, description="elements per optimizer-step tile")
    prefetch_bucket_size: int = _knob(50_000_000, alias="stage3_prefetch_bucket_size")
    param_persistence_threshold: int = _knob(100_000, alias="stage3_param_persistence_threshold")
    model_persistence_threshold: int = _knob(sys.maxsize, alias="stage3_model_persistence_threshold")
    max_live_parameters: int = _knob(1_000_000_000, alias="stage3_max_live_parameters")
    max_reuse_distance: int = _knob(1_000_000_000, alias="stage3_max_reuse_distance")
    gather_16bit_weights_on_model_save: Annotated[
        bool, deprecated_alias("stage3_gather_fp16_weights_on_model_save")] = Field(
            False, alias="stage3_gather_16bit_weights_on_model_save")

    ignore_unused_parameters: bool = True
    legacy_stage1: bool = False
    round_robin_gradients: bool = False
    zero_hpz_partition_size: int = _knob(1, description="ranks in the secondary (hpZ) partition group")
    zero_quantized_weights: bool = False
    zero_quantized_nontrainable_weights: bool = False
    zero_quantized_gradients: bool = False
    mics_shard_size: int = -1
    mics_hierarchical_params_gather: bool = False
    memory_efficient_linear: bool = True
    pipeline_loading_checkpoint: bool = False
    override_module_apply: bool = True
    zenflow: Optional[ZenFlowConfig] = Field(None, description="ZenFlow (deepspeed.zero.zenflow)")

    # keys that only tune how upstream's CUDA implementation copies or initialises, or choose
    # between implementations this build does not have: the core warns once, so nobody
    # measures a difference that cannot be there
    without_effect = {
        "round_robin_gradients": "every gradient bucket is reduce-scattered, so each rank "
                                 "already copies only its own 1/N slice of every bucket to "
                                 "the host: the copy is spread over all ranks at the finest "
                                 "grain, which upstream's round-robin parameter order only "
                                 "approximates; nothing is left to balance (offload_optimizer "
                                 "with overlap_comm is what speeds the copy up here)",
        "legacy_stage1": "this build has one stage 1 implementation (optimizer state "
                         "partitioned over the data-parallel ranks), which runs either way",
        "pipeline_loading_checkpoint": "load_checkpoint reads each rank's ZeRO-3 shards straight "
                                       "into their partitions with or without pipelining, and "
                                       "init_inference checkpoints do not go through ZeRO-3",
    }

    # -- input normalisation --------------------------------------------------------------------
    @model_validator(mode="before")
    @classmethod
    def _legacy_forms(cls, data: Any) -> Any:
        if isinstance(data, bool):
            warnings.warn(
                '"zero_optimization": true/false is deprecated; use "zero_optimization": '
                f'{{"stage": {int(data)}}} instead', ConfigDeprecationWarning, stacklevel=_user_stacklevel())
            return {"stage": int(data)}
        if isinstance(data, dict):
            if data.get("cpu_offload_use_pin_memory") is not None:
                warnings.warn(
                    "Config parameter 'cpu_offload_use_pin_memory' is deprecated; use 'pin_memory' "
                    "inside 'offload_optimizer' / 'offload_param' instead",
                    ConfigDeprecationWarning, stacklevel=_user_stacklevel())
        return data

    @field_validator("stage", mode="before")
    @classmethod
    def _stage_number(cls, value: Any) -> Any:
        # checked here so the message lists each stage once (the enum's max_stage alias would
        # make pydantic say "0, 1, 2, 3 or 3")
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) \
                or not 0 <= value <= ZeroStageEnum.max_stage:
            raise ValueError(f"must be 0, 1, 2 or 3, got {value!r}")
        return value

    @field_validator(*_INT_KNOBS, mode="before")
    @classmethod
    def _auto_and_fractional(cls, value: Any, info) -> Any:
        if isinstance(value, str) and value == AUTO:
            return cls.model_fields[info.field_name].default
        if isinstance(value, float) and math.isfinite(value) and not value.is_integer():
            truncated = int(value)
            warnings.warn(f"zero_optimization.{info.field_name}={value!r} is not an integer; "
                          f"using {truncated}", UserWarning, stacklevel=_user_stacklevel())
            return truncated
        return value

    # -- cross-field rules ------------------------------------------------------------------------
    @model_validator(mode="after")
    def _resolve_and_check(self):
        stage = int(self.stage)
        if self.overlap_comm is None:
            # Written to __dict__: a validated assignment would re-enter this validator.
            self.__dict__["overlap_comm"] = stage == ZeroStageEnum.weights
        if "allgather_size" in self.model_fields_set \
                and "allgather_bucket_size" not in self.model_fields_set:
            # the legacy name of the all-gather bucket size (the boolean form's era)
            self.__dict__["allgather_bucket_size"] = self.allgather_size
        if self.offload_param is not None and self.offload_param.enabled and stage < ZeroStageEnum.weights:
            raise ValueError(f"offload_param is only supported with ZeRO stage 3 (stage is {stage})")
        opt = self.offload_optimizer
        if opt is not None and opt.enabled and opt.ratio < 1.0 and stage < ZeroStageEnum.weights:
            raise ValueError("Partial offloading only supported for ZeRO Stage 3 "
                             f"(offload_optimizer.ratio={opt.ratio}, stage is {stage})")
        if opt is not None and opt.enabled and opt.ratio < 1.0 and self.zenflow is not None:
            raise ValueError(f"offload_optimizer.ratio={opt.ratio} (partial offload) does not "
                             f"combine with zenflow, which chooses itself what the CPU steps "
                             f"(zenflow.topk_ratio); use one or the other")
        self._apply_legacy_pin_memory()
        return self

    def _apply_legacy_pin_memory(self) -> None:
        value = self.cpu_offload_use_pin_memory
        if value is None:
            return
        targets = [(name, sub) for name, sub in (("offload_optimizer", self.offload_optimizer),
                                                 ("offload_param", self.offload_param)) if sub is not None]
        if not targets:
            logger.warning("zero_optimization.cpu_offload_use_pin_memory has no effect: no "
                           "offload_optimizer / offload_param is configured")
        for name, sub in targets:
            if "pin_memory" in sub.model_fields_set and sub.pin_memory != value:
                raise ValueError(f"Cannot provide deprecated parameter 'cpu_offload_use_pin_memory' and "
                                 f"replacing parameter '{name}.pin_memory' together")
            sub.__dict__["pin_memory"] = value

    # -- conveniences for the optimizer code --------------------------------------------------
    @property
    def offload_optimizer_device(self) -> OffloadDeviceEnum:
        """Where optimizer state lives ("none" when there is no offload_optimizer section)."""
        return self.offload_optimizer.device if self.offload_optimizer is not None else OffloadDeviceEnum.none

    @property
    def offload_param_device(self) -> OffloadDeviceEnum:
        """Where partitioned parameters live ("none" when there is no offload_param section)."""
        return self.offload_param.device if self.offload_param is not None else OffloadDeviceEnum.none

    # -- upstream's deprecated fields, read under their old names ---------------------------------
    # The API reference lists them as attributes; as keys they are accepted and mapped to their
    # replacements (with a warning), so reading one answers from the replacement.
    @property
    def cpu_offload(self) -> bool:
        """Deprecated, please use `offload_optimizer`: whether the optimizer state is offloaded
        to the CPU."""
        return self.offload_optimizer_device == OffloadDeviceEnum.cpu

    @property
    def cpu_offload_param(self) -> bool:
        """Deprecated, please use `offload_param`: whether the parameters are offloaded to the
        CPU."""
        return self.offload_param_device == OffloadDeviceEnum.cpu

    @property
    def stage3_gather_fp16_weights_on_model_save(self) -> bool:
        """Deprecated, please use `gather_16bit_weights_on_model_save`."""
        return self.gather_16bit_weights_on_model_save

    @classmethod
    def from_legacy_bool(cls, value: bool) -> "DeepSpeedZeroConfig":
        """The config meant by the legacy top-level `"zero_optimization": true/false` (stage 1/0)."""
        return from_legacy_bool(value, cls)


def from_legacy_bool(value: bool, config_cls=DeepSpeedZeroConfig) -> DeepSpeedZeroConfig:
    """Map the legacy boolean `zero_optimization` value to a config (warns: deprecated)."""
    if not isinstance(value, bool):
        raise TypeError(f"zero_optimization: the legacy form is a boolean, got {value!r}")
    return config_cls.model_validate(value)
