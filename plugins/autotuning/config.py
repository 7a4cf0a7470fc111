"""The ``autotuning`` config section: every documented key with the docs' default.

The tutorial's ``arg_mappings`` example spells ``"gradient_accumulation_steps "`` with a trailing
space; such keys are accepted with the space stripped, and a warning says so. Keys the docs'
table does not list but upstream reads (``metric_path``, ``model_info_path``, ``model_info``,
the batch bounds) are accepted too: the autotuner itself writes ``metric_path`` and
``model_info.profile`` into the configs of the jobs it launches.
"""
import warnings
from typing import Dict, Optional

from pydantic import Field, field_validator, model_validator

from deepspeed.config import DeepSpeedConfigModel

METRICS = ("throughput", "latency", "FLOPS")
TUNERS = ("gridsearch", "random", "model_based")


class ModelInfoConfig(DeepSpeedConfigModel):
    """What the profiling run measures (or what the user already knows about the model)."""

    tested_by = {
        "profile": "tests/plugins/pipe/test_module.py::test_partition_errors",
        "num_params": "tests/plugins/autotuning/test_autotuning_launch.py::test_tune_on_the_demo_gpt",
        "hidden_size": "tests/core/ops/test_transformer_kernel.py::test_bad_inputs_are_refused",
        "num_layers": "tests/plugins/sequence/test_sequence_offload.py::test_offload_ctx_manager_rejects_bad_arguments",
    }

    profile: bool = False
    """Set by the autotuner in its profiling run: record the model info, then exit."""
    num_params: Optional[int] = Field(None, ge=1)
    hidden_size: Optional[int] = Field(None, ge=1)
    num_layers: Optional[int] = Field(None, ge=1)


class AutotuningConfig(DeepSpeedConfigModel):
    """``deepspeed --autotuning tune|run``: search ZeRO stage x micro-batch (x ZeRO knobs)."""

    tested_by = {
        "enabled": "tests/plugins/autotuning/test_autotuning_launch.py::test_tune_on_the_demo_gpt",
        "overwrite": "tests/plugins/autotuning/test_autotuning_space.py::test_unchanged_experiment_is_reused_without_overwrite",
        "metric": "tests/plugins/autotuning/test_autotuning_launch.py::test_bad_autotuning_input_is_one_clear_line",
        "start_profile_step": "tests/plugins/autotuning/test_autotuning_launch.py::test_tune_on_the_demo_gpt",
        "end_profile_step": "tests/plugins/autotuning/test_autotuning_launch.py::test_tune_on_the_demo_gpt",
        "fast": "tests/plugins/autotuning/test_autotuning_space.py::test_nothing_to_tune_names_the_fixed_values",
        "max_train_batch_size": "tests/plugins/elasticity/test_elastic_compute.py::test_worked_example_v01",
        "mp_size": "tests/plugins/inference/test_inference_config.py::test_deprecated_keys_move_to_their_replacements",
        "tuner_type": "tests/plugins/autotuning/test_autotuning_launch.py::test_tune_on_the_demo_gpt",
        "arg_mappings": "tests/plugins/autotuning/test_autotuning_launch.py::test_run_mode_trains_with_the_best_config",
    }

    enabled: bool = False
    results_dir: str = "autotuning_results"
    exps_dir: str = "autotuning_exps"
    overwrite: bool = False
    """Re-run experiments whose results already exist in results_dir (false: reuse them)."""
    metric: str = "throughput"
    """What "best" means: throughput (samples/s, higher), latency (ms per step, lower) or FLOPS
    (floating point operations per second, higher)."""
    start_profile_step: int = Field(3, ge=0)
    end_profile_step: int = Field(5, ge=1)
    """Steps after ``start_profile_step`` up to this one are measured; then the job exits."""
    fast: bool = True
    """Tune only the ZeRO stage and the micro-batch size; false also tunes the stage's knobs."""
    max_train_batch_size: Optional[int] = Field(None, ge=1)
    min_train_batch_size: int = Field(1, ge=1)
    max_train_micro_batch_size_per_gpu: int = Field(1024, ge=1)
    min_train_micro_batch_size_per_gpu: int = Field(1, ge=1)
    num_tuning_micro_batch_sizes: int = Field(3, ge=1)
    mp_size: int = Field(1, ge=1)
    tuner_type: str = "model_based"
    tuner_early_stopping: int = Field(5, ge=1)
    """Stop a tuning space after this many experiments without a better metric."""
    tuner_num_trials: int = Field(50, ge=1)
    """At most this many experiments per tuning space."""
    arg_mappings: Optional[Dict[str, str]] = None
    """DeepSpeed config key (dotted for nested keys) -> the script's own flag carrying it."""
    metric_path: Optional[str] = None
    model_info_path: Optional[str] = None
    model_info: Optional[ModelInfoConfig] = None

    @field_validator("metric", mode="before")
    @classmethod
    def _metric(cls, value):
        for metric in METRICS:
            if isinstance(value, str) and value.lower() == metric.lower():
                return metric
        raise ValueError(f"unknown metric {value!r}; allowed: {', '.join(METRICS)}")

    @field_validator("tuner_type")
    @classmethod
    def _tuner(cls, value):
        if value not in TUNERS:
            raise ValueError(f"unknown tuner_type {value!r}; allowed: {', '.join(TUNERS)}")
        return value

    @field_validator("arg_mappings", mode="before")
    @classmethod
    def _strip_keys(cls, value):
        if not isinstance(value, dict):
            return value
        stripped = {}
        for key, flag in value.items():
            clean = key.strip() if isinstance(key, str) else key
            if clean != key:
                warnings.warn(f"autotuning.arg_mappings: key {key!r} has surrounding spaces (as "
                              f"in the autotuning tutorial); read as {clean!r}", stacklevel=2)
            if clean in stripped:
                raise ValueError(f"key {clean!r} is given twice (once with spaces)")
            stripped[clean] = flag
        return stripped

    @model_validator(mode="after")
    def _consistent(self):
        if self.end_profile_step <= self.start_profile_step:
            raise ValueError(f"end_profile_step ({self.end_profile_step}) must be greater than "
                             f"start_profile_step ({self.start_profile_step})")
        if self.max_train_micro_batch_size_per_gpu < self.min_train_micro_batch_size_per_gpu:
            raise ValueError(f"max_train_micro_batch_size_per_gpu "
                             f"({self.max_train_micro_batch_size_per_gpu}) is smaller than "
                             f"min_train_micro_batch_size_per_gpu "
                             f"({self.min_train_micro_batch_size_per_gpu})")
        if self.max_train_batch_size is not None and \
                self.max_train_batch_size < self.min_train_batch_size:
            raise ValueError(f"max_train_batch_size ({self.max_train_batch_size}) is smaller "
                             f"than min_train_batch_size ({self.min_train_batch_size})")
        return self
