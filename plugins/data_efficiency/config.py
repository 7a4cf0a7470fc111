"""The config sections this plugin owns: ``data_efficiency`` (curriculum data sampling and
random-LTD), the legacy seqlen ``curriculum_learning`` and ``progressive_layer_drop``.

Schedules are checked here, at ``deepspeed.initialize``, with the same messages as the
``CurriculumScheduler`` built by hand (``schedule_config.check_schedule``), so a config missing
``root_degree`` for ``fixed_root`` fails before any model is touched.
"""
from typing import Any, Dict, List, Literal, Optional

from pydantic import Field, model_validator

from deepspeed.config import DeepSpeedConfigModel

from .schedule_config import check_difficulty_range, check_schedule


def _check(model, where, difficulty_type="value"):
    check_difficulty_range(model.min_difficulty, model.max_difficulty, where, difficulty_type)
    # validated only: the scheduler normalises its own copy (assigning here would re-run
    # this validator through pydantic's validate_assignment)
    check_schedule(model.schedule_type, model.schedule_config, where)
    return model



# the tests named in the key-effect table (``tested_by``, see deepspeed.config.model)
SAMPLER = "tests/plugins/data_efficiency/test_curriculum_sampler.py::"
LTD = "tests/plugins/data_efficiency/test_random_ltd.py::"
SAMPLING_KEYS = "tests/plugins/data_efficiency/test_data_sampling_keys.py::"

class CurriculumMetricConfig(DeepSpeedConfigModel):
    """One metric of ``data_sampling.curriculum_learning.curriculum_metrics``."""
    tested_by = {
        **dict.fromkeys(("index_to_sample_path", "index_to_metric_path", "difficulty_type",
                         "min_difficulty", "max_difficulty", "schedule_type", "schedule_config"),
                        SAMPLER + "test_percentile_difficulty"),
        "clustering_type": SAMPLER + "test_single_cluster_metric_filters_nothing",
    }

    index_to_sample_path: Optional[str] = None
    index_to_metric_path: Optional[str] = None
    difficulty_type: Literal["value", "percentile"] = "value"
    clustering_type: Literal["schedule_based", "single_cluster"] = "schedule_based"
    min_difficulty: float
    max_difficulty: float
    schedule_type: str
    schedule_config: Dict[str, Any] = Field(default_factory=dict)


class DataSamplingCurriculumConfig(DeepSpeedConfigModel):
    tested_by = {"enabled": SAMPLING_KEYS + "test_num_workers_pin_memory_and_num_epochs_reach_"
                                            "the_loader"}

    without_effect = {
        "data_cluster_path": "the sampler keeps its clusters in memory (one shuffled queue of "
                             "the samples within the current difficulty) and writes no cluster "
                             "files; resume replays the draws from the checkpointed count",
    }
    enabled: bool = False
    data_cluster_path: Optional[str] = None
    curriculum_metrics: Dict[str, CurriculumMetricConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _schedules(self):
        where = "data_efficiency.data_sampling.curriculum_learning"
        if self.enabled and not self.curriculum_metrics:
            raise ValueError(f"{where}.enabled is true but curriculum_metrics is empty: name at "
                             f"least one metric with its schedule")
        for name, metric in self.curriculum_metrics.items():
            _check(metric, f"{where}.curriculum_metrics.{name}", metric.difficulty_type)
            if metric.clustering_type == "schedule_based" and self.enabled:
                for key in ("index_to_sample_path", "index_to_metric_path"):
                    if getattr(metric, key) is None:
                        raise ValueError(f"{where}.curriculum_metrics.{name}.{key} is required "
                                         f"by clustering_type 'schedule_based' (the sampler "
                                         f"reads the DataAnalyzer's index files)")
        return self


class DataSamplingConfig(DeepSpeedConfigModel):
    tested_by = {
        **dict.fromkeys(("enabled", "num_epochs", "num_workers", "pin_memory"),
                        SAMPLING_KEYS + "test_num_workers_pin_memory_and_num_epochs_reach_the_"
                                        "loader"),
    }

    enabled: bool = False
    num_epochs: int = Field(1000, ge=1)
    num_workers: int = Field(0, ge=0)
    pin_memory: bool = False
    curriculum_learning: DataSamplingCurriculumConfig = Field(
        default_factory=DataSamplingCurriculumConfig)


class RandomLTDScheduleConfig(DeepSpeedConfigModel):
    tested_by = dict.fromkeys(("min_value", "max_value", "schedule_type", "schedule_config"),
                              LTD + "test_unsampled_positions_pass_through_and_kept_count_"
                                    "follows_schedule")

    min_value: int = Field(..., ge=1)
    max_value: int = Field(..., ge=1)
    schedule_type: Literal["fixed_linear"] = "fixed_linear"
    schedule_config: Dict[str, int]

    @model_validator(mode="after")
    def _keys(self):
        where = "data_efficiency.data_routing.random_ltd.random_ltd_schedule"
        for key in ("require_steps", "seq_per_step"):
            value = self.schedule_config.get(key)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}.schedule_config.{key} must be a positive integer "
                                 f"(required by schedule_type 'fixed_linear'), got {value!r}")
        if self.min_value > self.max_value:
            raise ValueError(f"{where}: min_value ({self.min_value}) is larger than max_value "
                             f"({self.max_value})")
        return self


class LayerTokenLRScheduleConfig(DeepSpeedConfigModel):
    """The learning rate over the layer tokens random-LTD consumed rather than over steps
    (the random-LTD paper's LayerToken LR): a step that drops tokens moves the schedule less.
    Linear warmup to the optimizer's learning rate over ``warmup_layer_token``, then cosine
    decay to 0 at ``total_layer_token``."""
    tested_by = dict.fromkeys(("enabled", "total_layer_token", "warmup_layer_token"),
                              LTD + "test_layer_token_lr_schedule_follows_consumed_tokens")
    refused = {"warmup_type": "only a linear warmup is implemented; leave it 'linear'"}

    enabled: bool = False
    total_layer_token: Optional[int] = Field(None, ge=1)
    """Layer tokens at which the learning rate reaches 0."""
    warmup_layer_token: int = Field(0, ge=0)
    """Layer tokens of the linear warmup."""
    warmup_type: str = "linear"
    """The warmup's shape: "linear" (the only one)."""

    @model_validator(mode="after")
    def _total(self):
        if self.enabled and (self.total_layer_token is None
                             or self.total_layer_token <= self.warmup_layer_token):
            raise ValueError(f"data_efficiency.data_routing.random_ltd.layer_token_lr_schedule:"
                             f" total_layer_token ({self.total_layer_token}) must be set and "
                             f"larger than warmup_layer_token ({self.warmup_layer_token})")
        return self


class RandomLTDConfig(DeepSpeedConfigModel):
    tested_by = {
        # the engine only builds the scheduler when all three enabled flags are on
        "enabled": LTD + "test_engine_random_ltd_on_2_ranks",
        **dict.fromkeys(("total_layer_num", "random_ltd_layer_num",
                         "random_ltd_layer_id", "model_mask_name"),
                        LTD + "test_unsampled_positions_pass_through_and_kept_count_follows_"
                              "schedule"),
        **dict.fromkeys(("model_type", "hidden_state_order"),
                        LTD + "test_seq_batch_dim_and_encoder_mask"),
    }

    enabled: bool = False
    total_layer_num: Optional[int] = Field(None, ge=1)
    random_ltd_layer_num: Optional[int] = Field(None, ge=0)
    random_ltd_layer_id: List[int] = Field(default_factory=list)
    model_mask_name: Optional[str] = None
    model_type: Literal["decoder", "encoder"] = "decoder"
    hidden_state_order: Literal["batch_seq_dim", "seq_batch_dim"] = "batch_seq_dim"
    random_ltd_schedule: Optional[RandomLTDScheduleConfig] = None
    layer_token_lr_schedule: LayerTokenLRScheduleConfig = Field(
        default_factory=LayerTokenLRScheduleConfig)

    @model_validator(mode="after")
    def _layers(self):
        if not self.enabled:
            return self
        where = "data_efficiency.data_routing.random_ltd"
        for key in ("total_layer_num", "random_ltd_layer_num", "random_ltd_schedule"):
            if getattr(self, key) is None:
                raise ValueError(f"{where}.{key} is required when random_ltd is enabled")
        if len(self.random_ltd_layer_id) != self.random_ltd_layer_num:
            raise ValueError(f"{where}.random_ltd_layer_id has {len(self.random_ltd_layer_id)} "
                             f"ids but random_ltd_layer_num is {self.random_ltd_layer_num}")
        bad = [i for i in self.random_ltd_layer_id if not 0 <= i < self.total_layer_num]
        if bad:
            raise ValueError(f"{where}.random_ltd_layer_id {bad} outside [0, total_layer_num="
                             f"{self.total_layer_num})")
        return self


class DataRoutingConfig(DeepSpeedConfigModel):
    tested_by = {"enabled": LTD + "test_engine_random_ltd_on_2_ranks"}

    enabled: bool = False
    random_ltd: RandomLTDConfig = Field(default_factory=RandomLTDConfig)


class DataEfficiencyConfig(DeepSpeedConfigModel):
    tested_by = {"enabled": SAMPLING_KEYS + "test_num_workers_pin_memory_and_num_epochs_reach_"
                                            "the_loader",
                 "seed": SAMPLING_KEYS + "test_seed_fixes_the_draw"}

    enabled: bool = False
    seed: int = 1234
    data_sampling: DataSamplingConfig = Field(default_factory=DataSamplingConfig)
    data_routing: DataRoutingConfig = Field(default_factory=DataRoutingConfig)

    def sampling_enabled(self):
        return (self.enabled and self.data_sampling.enabled
                and self.data_sampling.curriculum_learning.enabled)

    def random_ltd_enabled(self):
        return self.enabled and self.data_routing.enabled and self.data_routing.random_ltd.enabled


class CurriculumLearningLegacyConfig(DeepSpeedConfigModel):
    """The legacy seqlen ``curriculum_learning`` section (tutorials: curriculum-learning)."""
    tested_by = dict.fromkeys(
        ("enabled", "curriculum_type", "min_difficulty", "max_difficulty", "schedule_type",
         "schedule_config"),
        "tests/plugins/data_efficiency/test_pld_and_legacy_curriculum.py::"
        "test_legacy_curriculum_on_2_ranks")

    enabled: bool = False
    curriculum_type: Literal["seqlen"] = "seqlen"
    min_difficulty: Optional[int] = None
    max_difficulty: Optional[int] = None
    schedule_type: Optional[str] = None
    schedule_config: Dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _schedule(self):
        if not self.enabled:
            return self
        for key in ("min_difficulty", "max_difficulty", "schedule_type"):
            if getattr(self, key) is None:
                raise ValueError(f"curriculum_learning.{key} is required when curriculum "
                                 f"learning is enabled")
        if self.min_difficulty < 1:
            raise ValueError(f"curriculum_learning.min_difficulty must be a sequence length >= 1 "
                             f"for curriculum_type 'seqlen', got {self.min_difficulty}")
        return _check(self, "curriculum_learning")


class ProgressiveLayerDropConfig(DeepSpeedConfigModel):
    tested_by = dict.fromkeys(("enabled", "theta", "gamma"),
                              "tests/plugins/data_efficiency/test_pld_and_legacy_curriculum.py::"
                              "test_pld_engine_on_2_ranks")

    enabled: bool = False
    theta: float = Field(0.5, ge=0.0, le=1.0)
    gamma: float = Field(0.001, ge=0.0)
