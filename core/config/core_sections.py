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


class FP16Config(DeepSpeedConfigModel):
    """`fp16`: mixed precision with (by default dynamic) loss scaling."""

    tested_by = {
        "enabled": "tests/plugins/zero/test_zero_mics.py::test_16_bit_training_follows_zero3",
        "loss_scale": "tests/plugins/monitor/test_monitor_engine.py::test_fp16_adds_the_loss_scale",
        "initial_scale_power": "tests/plugins/zero/test_zero_mics.py::test_16_bit_training_follows_zero3",
        "loss_scale_window": "tests/core/precision/test_precision_engine.py::test_fp16_dynamic_scale_skips_overflow_steps",
        "hysteresis": "tests/core/precision/test_precision_engine.py::test_fp16_dynamic_scale_skips_overflow_steps",
        "consecutive_hysteresis": "tests/core/config/test_config_core_sections.py::test_fp16_loss_scaler_args",
        "min_loss_scale": "tests/core/config/test_deepspeed_config.py::test_to_dict_round_trips",
    }

    enabled: bool = False
    auto_cast: bool = False
    loss_scale: float = Field(0.0, ge=0, description="0 = dynamic loss scaling")
    initial_scale_power: int = Field(16, ge=0, description="dynamic scaling starts at 2**power")
    loss_scale_window: int = Field(1000, ge=1)
    hysteresis: int = Field(2, ge=1)
    consecutive_hysteresis: bool = False
    min_loss_scale: float = Field(1.0, gt=0)
    fp16_master_weights_and_grads: bool = False

    without_effect = {
        "fp16_master_weights_and_grads":
            "the optimizer always steps fp32 master weights with fp32 gradients; keeping them in "
            "fp16 (upstream's ZeRO-Offload memory saving) is not implemented",
    }

    @property
    def dynamic_loss_scale(self) -> bool:
        return self.loss_scale == 0


class BF16Config(DeepSpeedConfigModel):
    """`bf16` (old name `bfloat16`): bfloat16 training; same range as fp32, so no loss scaling."""

    tested_by = {
        "enabled": "tests/plugins/zero/test_zero_mics.py::test_16_bit_training_follows_zero3",
    }

    enabled: bool = False
    immediate_grad_update: bool = False

    without_effect = {
        "immediate_grad_update":
            "bf16 gradients reach the accumulation buffer (data_types.grad_accum_dtype) after each "
            "backward; moving them one parameter at a time during backward, upstream's "
            "memory/overlap optimisation, is not implemented",
    }


class AmpConfig(DeepSpeedConfigModel):
    """`amp`: NVIDIA apex AMP. Besides `enabled`, every key is an `apex.amp.initialize` argument
    and is passed through unchanged (apex validates them); they are declared so typos still fail."""

    tested_by = {
        "enabled": "tests/plugins/zero/test_zero_audit_gaps.py::test_amp_with_zero_is_refused",
        "opt_level": "tests/core/config/test_config_core_sections.py::test_amp_passes_apex_keys_through",
        "keep_batchnorm_fp32": "tests/core/config/test_config_core_sections.py::test_amp_passes_apex_keys_through",
        "loss_scale": "tests/core/config/test_config_core_sections.py::test_amp_passes_apex_keys_through",
        "min_loss_scale": "tests/core/config/test_deepspeed_config.py::test_to_dict_round_trips",
    }

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

    tested_by = {
        "type": "tests/e2e/test_hf_accelerate.py::test_accelerate_launch_trains_and_saves",
        "params": "tests/e2e/test_hf_accelerate.py::test_accelerate_launch_trains_and_saves",
    }

    type: str
    params: Dict[str, Any] = Field(default_factory=dict)


class SchedulerConfig(DeepSpeedConfigModel):
    """`scheduler`: which LR schedule the engine builds; `params` go to its constructor as-is."""

    tested_by = {
        "type": "tests/plugins/pipe/test_pipe_checkpoint.py::test_resume_at_the_same_shape_is_bit_identical",
        "params": "tests/core/checkpoint/test_engine_checkpoint.py::test_load_options",
    }

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

    tested_by = {
        "type": "tests/plugins/pipe/test_pipe_checkpoint.py::test_resume_at_the_same_shape_is_bit_identical",
        "format": "tests/plugins/pipe/test_pipe_checkpoint.py::test_resume_at_the_same_shape_is_bit_identical",
    }

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

    tested_by = {
        "enabled": "tests/core/checkpoint/test_checkpoint_engines.py::test_checkpoint_section_keys_parse_and_choose_the_engine",
    }

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
        "tag_validation": "tests/core/checkpoint/test_checkpoint_engines.py::test_checkpoint_section_keys_parse_and_choose_the_engine",
        "load_universal": "tests/plugins/zero/test_zero_universal.py::test_wrong_folder_kinds_are_refused_clearly",
        "use_node_local_storage": "tests/core/checkpoint/test_checkpoint_engines.py::test_checkpoint_section_keys_parse_and_choose_the_engine",
    }

    tag_validation: Literal["Ignore", "Warn", "Fail"] = "Warn"
    load_universal: bool = False
    use_node_local_storage: bool = False
    parallel_write: ParallelWriteConfig = Field(default_factory=ParallelWriteConfig)
    checkpoint_engine: CheckpointEngineConfig = Field(default_factory=CheckpointEngineConfig)

    without_effect = {
        "parallel_write.pipeline_stage": "no pipeline-parallel engine in this build writes "
                                         "checkpoints per stage",
    }

    @field_validator("tag_validation", mode="before")
    @classmethod
    def _case_insensitive_mode(cls, value):
        if isinstance(value, str):
            return value.strip().capitalize()
        return value


class DataTypesConfig(DeepSpeedConfigModel):
    """`data_types`: dtype of the gradient-accumulation buffer (None = the training dtype)."""

    tested_by = {
        "grad_accum_dtype": "tests/core/precision/test_precision_engine.py::test_bf16_fp32_grad_accumulation_is_closer_to_exact",
    }

    grad_accum_dtype: Optional[Literal["fp32", "fp16", "bf16"]] = None


class ActivationCheckpointingConfig(DeepSpeedConfigModel):
    """`activation_checkpointing`: read by `deepspeed.checkpointing.configure`."""

    tested_by = {
        "partition_activations": "tests/core/activation_checkpointing/test_ac_configure.py::test_configure_from_a_config_dict",
        "contiguous_memory_optimization": "tests/core/activation_checkpointing/test_ac_configure.py::test_configure_from_a_config_dict",
        "cpu_checkpointing": "tests/core/activation_checkpointing/test_ac_configure.py::test_configure_from_a_config_dict",
        "number_checkpoints": "tests/core/activation_checkpointing/test_ac_configure.py::test_configure_from_a_config_dict",
        "synchronize_checkpoint_boundary": "tests/core/activation_checkpointing/test_ac_configure.py::test_configure_from_a_config_dict",
        "profile": "tests/core/activation_checkpointing/test_ac_configure.py::test_configure_from_a_config_dict",
    }

    # the Megatron tutorial spells it `partition_activation`
    partition_activations: Annotated[bool, deprecated_alias("partition_activation")] = False
    contiguous_memory_optimization: bool = False
    cpu_checkpointing: bool = False
    number_checkpoints: Optional[int] = Field(None, ge=1)
    synchronize_checkpoint_boundary: bool = False
    profile: bool = False


class CoreConfig(DeepSpeedConfigModel):
    """Every top-level key the core engine owns."""

    tested_by = {
        "train_batch_size": "tests/core/test_api.py::test_initialize_requires_a_model",
        "train_micro_batch_size_per_gpu": "tests/e2e/test_hf_import_paths.py::test_hf_integration_sees_deepspeed",
        "gradient_accumulation_steps": "tests/e2e/test_hf_accelerate.py::test_accelerate_launch_trains_and_saves",
        "gradient_clipping": "tests/plugins/pipe/test_pipe_engine.py::test_gradient_clipping_uses_the_norm_over_all_stages",
        "steps_per_print": "tests/plugins/autotuning/test_autotuning_launch.py::test_tune_on_the_demo_gpt",
        "wall_clock_breakdown": "tests/core/precision/test_precision_engine.py::test_steps_per_print_and_wall_clock_breakdown",
        "dump_state": "tests/core/test_engine_sparse_and_reports.py::test_memory_breakdown_off_reports_nothing_and_dump_state_prints_the_engine",
        "memory_breakdown": "tests/core/test_engine_sparse_and_reports.py::test_memory_breakdown_reports_memory_around_each_step_on_rank_0",
        "prescale_gradients": "tests/core/test_engine_sparse_and_reports.py::test_sparse_gradients_with_prescaling_and_a_communication_dtype",
        "gradient_predivide_factor": "tests/core/test_engine_sparse_and_reports.py::test_sparse_gradients_with_prescaling_and_a_communication_dtype",
        "sparse_gradients": "tests/core/test_engine_sparse_and_reports.py::test_sparse_gradients_with_prescaling_and_a_communication_dtype",
        "communication_data_type": "tests/core/precision/test_precision_engine.py::test_communication_data_type_sets_the_reduction_dtype",
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
