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



# the tests named in the key-effect table (``tested_by``, see deepspeed.config.model)
KEYS = "tests/plugins/autotuning/test_autotuning_keys.py::"
SPACE = "tests/plugins/autotuning/test_autotuning_space.py::"
LAUNCH = "tests/plugins/autotuning/test_autotuning_launch.py::"

class ModelInfoConfig(DeepSpeedConfigModel):
    """What the profiling run measures (or what the user already knows about the model)."""

    tested_by = {
        "profile": KEYS + "test_metric_path_and_model_info_profile_switch_the_probe_plugin_on",
        "num_params": KEYS + "test_trial_budget_early_stop_directories_and_model_info",
    }
    without_effect = dict.fromkeys(
        ("hidden_size", "num_layers"),
        "the profiling run reads the model's width and depth from the model itself, and the "
        "memory estimate needs only num_params and the measured activation bytes")

    profile: bool = False
    """Set by the autotuner in its profiling run: record the model info, then exit."""
    num_params: Optional[int] = Field(None, ge=1)
    hidden_size: Optional[int] = Field(None, ge=1)
    num_layers: Optional[int] = Field(None, ge=1)


class AutotuningConfig(DeepSpeedConfigModel):
    """``deepspeed --autotuning tune|run``: search ZeRO stage x micro-batch (x ZeRO knobs)."""

    # what each key does here (see deepspeed.config.model)
    tested_by = {
        "enabled": KEYS + "test_metric_path_and_model_info_profile_switch_the_probe_plugin_on",
        "results_dir": KEYS + "test_trial_budget_early_stop_directories_and_model_info",
        "exps_dir": KEYS + "test_trial_budget_early_stop_directories_and_model_info",
        **dict.fromkeys(("overwrite", "metric"),
                        KEYS + "test_metric_chooses_the_best_and_overwrite_reaches_every_job"),
        "start_profile_step": LAUNCH + "test_tune_on_the_demo_gpt",
        "end_profile_step": LAUNCH + "test_tune_on_the_demo_gpt",
        "fast": SPACE + "test_nothing_to_tune_names_the_fixed_values",
        **dict.fromkeys(("max_train_batch_size", "min_train_batch_size",
                         "max_train_micro_batch_size_per_gpu",
                         "min_train_micro_batch_size_per_gpu", "num_tuning_micro_batch_sizes"),
                        KEYS + "test_micro_batch_bounds_shape_the_search"),
        "mp_size": KEYS + "test_trial_budget_early_stop_directories_and_model_info",
        "tuner_type": KEYS + "test_tuner_type_chooses_the_order_of_the_experiments",
        "tuner_early_stopping": KEYS + "test_trial_budget_early_stop_directories_and_model_info",
        "tuner_num_trials": KEYS + "test_trial_budget_early_stop_directories_and_model_info",
        "arg_mappings": LAUNCH + "test_run_mode_trains_with_the_best_config",
        "metric_path": KEYS + "test_metric_path_and_model_info_profile_switch_the_probe_plugin_on",
        "model_info_path": KEYS + "test_trial_budget_early_stop_directories_and_model_info",
        **dict.fromkeys(("plan_pruning", "plan_keep_ratio"),
                        KEYS + "test_plan_pruning_runs_fewer_experiments_for_the_same_best"),
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
    plan_pruning: bool = False
    """Before any experiment runs, estimate every one with ``deepspeed.plan`` (from the
    profiling run's figures) and skip those it predicts do not fit or reach less than
    ``plan_keep_ratio`` of the best predicted metric."""
    plan_keep_ratio: float = Field(0.8, gt=0, le=1)
    """With ``plan_pruning``: the fraction of the best predicted metric an experiment must
    reach to be run (1: only the predicted best; smaller keeps more)."""
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
