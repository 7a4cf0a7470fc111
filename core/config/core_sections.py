"""The core (non-plugin) config keys: batch sizes, precision, optimizer/scheduler, checkpoint.

Defaults follow the DeepSpeed docs; where the docs are silent the choice is written next to the
field. Feature sections (`zero_optimization`, monitors, profilers, ...) are *not* here: their
plugins contribute them (see feature_sections.py).
"""
from typing import Annotated, Any, Dict, Literal, Optional

from pydantic import Field, field_validator, model_validator

from deepspeed.config.model import DeepSpeedConfigModel, deprecated_alias

# communication_data_type: the HF docs list "bfp16"; upstream (and torch) spell it "bf16".
# Both are accepted and the resolved config always says "bf16".
COMMUNICATION_DATA_TYPES = ("fp16", "bf16", "fp32")
_COMM_DTYPE_SPELLINGS = {"fp16": "fp16", "fp32": "fp32", "bf16": "bf16", "bfp16": "bf16"}

# the tests named in the key-effect table (``tested_by``, see deepspeed.config.model)
PRECISION = "tests/core/precision/test_precision_engine.py::"
KEYS = "tests/core/test_core_key_effects.py::"
ENGINE = "tests/core/test_engine.py::"
REPORTS = "tests/core/test_engine_sparse_and_reports.py::"
CHECKPOINT = "tests/core/checkpoint/test_engine_checkpoint.py::"
ENGINES = "tests/core/checkpoint/test_checkpoint_engines.py::"
AC = "tests/core/activation_checkpointing/test_ac_configure.py::"


class FP16Config(DeepSpeedConfigModel):
    """`fp16`: mixed precision with (by default dynamic) loss scaling."""

    tested_by = {
        "enabled": PRECISION + "test_fp16_dynamic_scale_skips_overflow_steps",
        "auto_cast": KEYS + "test_fp16_auto_cast_casts_float_inputs",
        "loss_scale": PRECISION + "test_fp16_static_scale_stays_and_still_skips",
        **dict.fromkeys(("initial_scale_power", "loss_scale_window", "hysteresis",
                         "consecutive_hysteresis", "min_loss_scale"),
                        KEYS + "test_the_fp16_loss_scaler_is_built_from_its_keys"),
        # ZeRO-Offload's (the zero plugin keeps its masters in fp16; refused elsewhere)
        "fp16_master_weights_and_grads": "tests/plugins/zero/test_zero_fp16_masters.py::"
                                         "test_fp16_masters_halve_the_offloaded_bytes_and_train_"
                                         "alike",
    }

    enabled: bool = False
    auto_cast: bool = False
    loss_scale: float = Field(0.0, ge=0, description="0 = dynamic loss scaling")
    initial_scale_power: int = Field(16, ge=0, description="dynamic scaling starts at 2**power")
    loss_scale_window: int = Field(1000, ge=1)
    hysteresis: int = Field(2, ge=1)
    consecutive_hysteresis: bool = False
    min_loss_scale: float = Field(1.0, gt=0)
    fp16_master_weights_and_grads: bool = Field(
        False, description="fp16 masters and gradients (ZeRO stage 2 with CPU optimizer offload)")

    @property
    def dynamic_loss_scale(self) -> bool:
        return self.loss_scale == 0


class BF16Config(DeepSpeedConfigModel):
    """`bf16` (old name `bfloat16`): bfloat16 training; same range as fp32, so no loss scaling."""

    tested_by = {"enabled": PRECISION + "test_bf16_trains_close_to_fp32_with_fp32_masters",
                 "immediate_grad_update": PRECISION + "test_bf16_immediate_grad_update_frees_"
                                                      "each_grad_during_backward"}

    enabled: bool = False
    immediate_grad_update: bool = Field(
        False, description="move each bf16 gradient into the fp32 accumulator (data_types."
                           "grad_accum_dtype fp32) from a hook as backward produces it")


class AmpConfig(DeepSpeedConfigModel):
    """`amp`: NVIDIA apex AMP. Besides `enabled`, every key is an `apex.amp.initialize` argument
    and is passed through unchanged (apex validates them); they are declared so typos still fail."""

    tested_by = dict.fromkeys(
        ("enabled", "opt_level", "cast_model_type", "patch_torch_functions", "keep_batchnorm_fp32",
         "master_weights", "loss_scale", "cast_model_outputs", "num_losses", "verbosity",
         "min_loss_scale", "max_loss_scale"),
        KEYS + "test_every_amp_key_reaches_apex_amp_initialize")

    enabled: bool = False
    opt_level: Optional[str] = None
    cast_model_type: Optional[Any] = None
    patch_torch_functions: Optional[bool] = None
    keep_batchnorm_fp32: Optional[Any] = None
    master_weights: Optional[bool] = None
    loss_scale: Optional[Any] = None
    cast_model_outputs: Optional[Any] = None
    num_losses: Optional[int] = None
    verbosity: Optional[int] = None
    min_loss_scale: Optional[float] = None
    max_loss_scale: Optional[float] = None

    def apex_params(self) -> Dict[str, Any]:
        """The kwargs for `apex.amp.initialize`: every apex key the user actually set."""
        return {k: getattr(self, k) for k in self.model_fields_set if k != "enabled"}


class OptimizerConfig(DeepSpeedConfigModel):
    """`optimizer`: which optimizer the engine builds; `params` go to its constructor as-is."""

    tested_by = dict.fromkeys(("type", "params"), "tests/core/optimizers/test_optimizer_engine.py::"
                              "test_config_optimizers_match_plain_pytorch_on_the_global_batch")

    type: str
    params: Dict[str, Any] = Field(default_factory=dict)


class SchedulerConfig(DeepSpeedConfigModel):
    """`scheduler`: which LR schedule the engine builds; `params` go to its constructor as-is."""

    tested_by = dict.fromkeys(("type", "params"), "tests/core/lr_schedules/test_lr_engine.py::"
                              "test_config_scheduler_steps_at_accumulation_boundaries")

    type: str
    params: Dict[str, Any] = Field(default_factory=dict)


class ParallelWriteConfig(DeepSpeedConfigModel):
    """`checkpoint.parallel_write`: with pipeline parallelism, every stage writes its own layers."""

    pipeline_stage: bool = False


CHECKPOINT_ENGINES = ("torch", "safetensors", "async")
CHECKPOINT_FILE_FORMATS = ("torch", "safetensors")


class CheckpointEngineConfig(DeepSpeedConfigModel):
    """`checkpoint.checkpoint_engine`: how checkpoint files are written. A plain string is the
    `type`; the object form also chooses the file `format` the asynchronous engine writes.

    "torch" (default) and "safetensors" write synchronously; "async" snapshots the state to host
    memory, writes in the background while training goes on, and moves `latest` only when the
    tag is committed (the next save, or `engine.checkpoint_engine.wait()`)."""

    tested_by = dict.fromkeys(("type", "format"), ENGINES + "test_checkpoint_section_keys_parse_"
                              "and_choose_the_engine")

    type: Literal["torch", "safetensors", "async"] = "torch"
    # None: "safetensors" for type "safetensors", else "torch"
    format: Optional[Literal["torch", "safetensors"]] = None

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value):
        return {"type": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _format_matches_type(self):
        if self.type != "async" and self.format is not None and self.format != self.type:
            raise ValueError(f"checkpoint.checkpoint_engine.format '{self.format}' contradicts "
                             f"type '{self.type}'; 'format' only chooses what the 'async' "
                             f"engine writes (allowed: {list(CHECKPOINT_FILE_FORMATS)})")
        return self

    @property
    def file_format(self) -> str:
        if self.format is not None:
            return self.format
        return "safetensors" if self.type == "safetensors" else "torch"


class DataStatesConfig(DeepSpeedConfigModel):
    """`datastates_ckpt`: DataStates-LLM asynchronous checkpointing. Without the external
    package the built-in "async" checkpoint engine does the same job (with a warning)."""

    host_cache_size: float = Field(16, gt=0, description="GB of pinned host memory for flushing")

    without_effect = {
        "host_cache_size": "the built-in asynchronous engine that serves datastates_ckpt snapshots "
                           "the state to host memory as a whole, without a cache of fixed size",
    }


_NEBULA = "Nebula is not integrated; the built-in asynchronous checkpoint engine that serves it "


class NebulaConfig(DeepSpeedConfigModel):
    """`nebula`: Azure Nebula asynchronous checkpointing. When enabled without the external
    service, the built-in "async" checkpoint engine is used (with a warning)."""

    tested_by = {"enabled": ENGINES + "test_checkpoint_section_keys_parse_and_choose_the_engine"}

    enabled: bool = False
    persistent_storage_path: Optional[str] = None
    persistent_time_interval: int = Field(100, ge=1)
    num_of_version_in_retention: int = Field(2, ge=1)
    enable_nebula_load: bool = True
    load_path: Optional[str] = None

    without_effect = {
        "persistent_storage_path": _NEBULA + "writes to save_checkpoint's directory",
        "persistent_time_interval": _NEBULA + "persists every checkpoint it is asked to save",
        "num_of_version_in_retention": _NEBULA + "deletes no checkpoint versions",
        "enable_nebula_load": _NEBULA + "loads what load_checkpoint names, from disk",
        "load_path": _NEBULA + "loads from load_checkpoint's directory",
    }


class CheckpointConfig(DeepSpeedConfigModel):
    """`checkpoint`: how checkpoints are validated, written and loaded."""

    tested_by = {
        "tag_validation": CHECKPOINT + "test_tag_validation_modes",
        "load_universal": "tests/plugins/zero/test_zero_universal.py::test_resume_on_another_"
                          "topology",
        "use_node_local_storage": CHECKPOINT + "test_node_local_storage_writes_model_states_on_"
                                               "every_node",
    }

    tag_validation: Literal["Ignore", "Warn", "Fail"] = "Warn"
    load_universal: bool = False
    use_node_local_storage: bool = False
    parallel_write: ParallelWriteConfig = Field(default_factory=ParallelWriteConfig)
    checkpoint_engine: CheckpointEngineConfig = Field(default_factory=CheckpointEngineConfig)

    without_effect = {
        "parallel_write.pipeline_stage": "a pipeline's checkpoint is written as before: the "
                                         "first data-parallel rank of each stage writes all of "
                                         "the stage's layer files",
    }

    @field_validator("tag_validation", mode="before")
    @classmethod
    def _case_insensitive_mode(cls, value):
        if isinstance(value, str):
            return value.strip().capitalize()
        return value


class DataTypesConfig(DeepSpeedConfigModel):
    """`data_types`: dtype of the gradient-accumulation buffer (None = the training dtype)."""

    tested_by = {"grad_accum_dtype": PRECISION + "test_bf16_fp32_grad_accumulation_is_closer_to_"
                                                 "exact"}

    grad_accum_dtype: Optional[Literal["fp32", "fp16", "bf16"]] = None


class ActivationCheckpointingConfig(DeepSpeedConfigModel):
    """`activation_checkpointing`: read by `deepspeed.checkpointing.configure`."""

    tested_by = dict.fromkeys(
        ("partition_activations", "contiguous_memory_optimization", "cpu_checkpointing",
         "number_checkpoints", "synchronize_checkpoint_boundary", "profile"),
        AC + "test_configure_from_a_config_dict")

    # the Megatron tutorial spells it `partition_activation`
    partition_activations: Annotated[bool, deprecated_alias("partition_activation")] = False
    contiguous_memory_optimization: bool = False
    cpu_checkpointing: bool = False
    number_checkpoints: Optional[int] = Field(None, ge=1)
    synchronize_checkpoint_boundary: bool = False
    profile: bool = False


class CoreConfig(DeepSpeedConfigModel):
    """Every top-level key the core engine owns."""

    # what each key does here (see deepspeed.config.model); sections say it for their own keys
    tested_by = {
        "train_batch_size": "tests/core/config/test_config_batch.py::"
                            "test_train_batch_size_sets_the_accumulation_steps",
        "train_micro_batch_size_per_gpu": REPORTS + "test_sparse_gradients_with_prescaling_and_"
                                                    "a_communication_dtype",
        "gradient_accumulation_steps": ENGINE + "test_data_parallel_matches_single_process_"
                                                "reference",
        "gradient_clipping": ENGINE + "test_global_grad_norm_is_measured_when_clipping",
        "steps_per_print": PRECISION + "test_steps_per_print_and_wall_clock_breakdown",
        "wall_clock_breakdown": PRECISION + "test_steps_per_print_and_wall_clock_breakdown",
        "dump_state": REPORTS + "test_memory_breakdown_off_reports_nothing_and_dump_state_prints_"
                                "the_engine",
        "memory_breakdown": REPORTS + "test_memory_breakdown_reports_memory_around_each_step_on_"
                                      "rank_0",
        **dict.fromkeys(("prescale_gradients", "gradient_predivide_factor"),
                        KEYS + "test_prescale_gradients_divides_before_the_reduction_so_fp16_"
                               "sums_stay_in_range"),
        "sparse_gradients": REPORTS + "test_sparse_embedding_gradients_average_like_the_global_"
                                      "batch",
        "communication_data_type": PRECISION + "test_communication_data_type_sets_the_reduction_"
                                               "dtype",
        "dataloader_drop_last": KEYS + "test_dataloader_drop_last_drops_the_partial_batch",
    }

    # batch triangle: resolved by batch.py, so all three are optional here
    train_batch_size: Optional[int] = None
    train_micro_batch_size_per_gpu: Optional[int] = None
    gradient_accumulation_steps: Optional[int] = None

    # The docs never state the default and upstream changed it (0 in older releases, 1.0 later).
    # 0.0 = no clipping: a user who wants clipping says so, and HF fills it from max_grad_norm.
    gradient_clipping: float = Field(0.0, ge=0)
    # None disables the periodic progress line.
    # Accelerate sets float("inf") for "never": kept as None, which turns the report off
    steps_per_print: Optional[int] = Field(10, ge=1)
    wall_clock_breakdown: bool = False
    dump_state: bool = False
    memory_breakdown: bool = False
    prescale_gradients: bool = False
    gradient_predivide_factor: float = Field(1.0, gt=0)
    sparse_gradients: bool = False
    communication_data_type: Optional[str] = None

    fp16: FP16Config = Field(default_factory=FP16Config)
    bf16: Annotated[BF16Config, deprecated_alias("bfloat16")] = Field(default_factory=BF16Config)
    amp: AmpConfig = Field(default_factory=AmpConfig)
    optimizer: Optional[OptimizerConfig] = None
    scheduler: Optional[SchedulerConfig] = None
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    # DataStates-LLM / Nebula asynchronous checkpointing: served by the built-in async engine
    datastates_ckpt: Optional[DataStatesConfig] = None
    nebula: Optional[NebulaConfig] = None
    data_types: DataTypesConfig = Field(default_factory=DataTypesConfig)
    activation_checkpointing: ActivationCheckpointingConfig = Field(
        default_factory=ActivationCheckpointingConfig)

    dataloader_drop_last: bool = False

    @field_validator("steps_per_print", mode="before")
    @classmethod
    def _infinite_means_never(cls, value):
        if isinstance(value, float) and value == float("inf"):
            return None
        return value

    @field_validator("communication_data_type", mode="before")
    @classmethod
    def _normalise_comm_dtype(cls, value):
        if value is None:
            return None
        if not isinstance(value, str) or value.lower() not in _COMM_DTYPE_SPELLINGS:
            raise ValueError(
                f"Invalid communication_data_type. Supported data types: "
                f"{list(COMMUNICATION_DATA_TYPES)} ('bfp16' is accepted as a spelling of 'bf16')")
        return _COMM_DTYPE_SPELLINGS[value.lower()]

    @model_validator(mode="after")
    def _one_precision_mode(self):
        enabled = [name for name in ("fp16", "bf16", "amp") if getattr(self, name).enabled]
        if len(enabled) > 1:
            names = " and ".join(enabled)
            raise ValueError(
                f"{names} cannot be enabled at once ({', '.join(f'{n}.enabled=true' for n in enabled)}); "
                f"choose a single mixed-precision mode")
        return self
