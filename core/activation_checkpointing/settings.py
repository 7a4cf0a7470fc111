"""`configure()`: the process-wide settings every `checkpoint()` call reads.

The settings are global on purpose: `checkpoint` is called deep inside model code (Megatron
layers, pipeline stages) that has no handle on an engine, exactly like `torch.utils.checkpoint`.
Settings come from the `activation_checkpointing` config section and are overridden one by one by
the explicit keyword arguments; the combination is then checked against the documented rules.
"""
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from deepspeed.activation_checkpointing.buffers import ContiguousBuffers
from deepspeed.config import ActivationCheckpointingConfig, DeepSpeedConfig, load_config_source
from deepspeed.config.loader import describe_source
from deepspeed.config.validation import validate_config

SECTION = "activation_checkpointing"

# configure() keyword -> the `activation_checkpointing` config key it overrides
KWARG_TO_CONFIG_KEY = {
    "partition_activations": "partition_activations",
    "contiguous_checkpointing": "contiguous_memory_optimization",
    "num_checkpoints": "number_checkpoints",
    "checkpoint_in_cpu": "cpu_checkpointing",
    "synchronize": "synchronize_checkpoint_boundary",
    "profile": "profile",
}

# (mpu method suffix) -> the Megatron spellings accepted for it, newest first
_MPU_METHODS = {
    "rank": ("get_tensor_model_parallel_rank", "get_model_parallel_rank"),
    "world_size": ("get_tensor_model_parallel_world_size", "get_model_parallel_world_size"),
    "group": ("get_tensor_model_parallel_group", "get_model_parallel_group"),
}


@dataclass(frozen=True)
class CheckpointingSettings:
    """What `checkpoint()` does; the field names are the `configure()` keywords."""

    mpu: Any = None
    partition_activations: bool = False
    contiguous_checkpointing: bool = False
    num_checkpoints: Optional[int] = None
    checkpoint_in_cpu: bool = False
    synchronize: bool = False
    profile: bool = False


@dataclass
class _State:
    settings: CheckpointingSettings = field(default_factory=CheckpointingSettings)
    configured: bool = False
    buffers: ContiguousBuffers = field(default_factory=ContiguousBuffers)


_STATE = _State()


def current() -> CheckpointingSettings:
    return _STATE.settings


def contiguous_buffers() -> ContiguousBuffers:
    return _STATE.buffers


def is_configured() -> bool:
    """True once `configure()` has been called in this process."""
    return _STATE.configured


def reset() -> None:
    """Drop the contiguous-memory buffers.

    A backward pass releases them by itself; call this after forward passes that had no backward
    (evaluation with grad enabled), otherwise the next forward finds the slots still taken.
    """
    _STATE.buffers.release()


# -- the model-parallel unit ----------------------------------------------------------------------
def _mpu_method(mpu, what: str):
    for name in _MPU_METHODS[what]:
        method = getattr(mpu, name, None)
        if callable(method):
            return method
    raise TypeError(f"mpu_ {type(mpu).__name__} has none of {' / '.join(_MPU_METHODS[what])}(); "
                    f"activation checkpointing needs the model-parallel rank, world size and group")


def model_parallel_rank(mpu) -> int:
    return 0 if mpu is None else int(_mpu_method(mpu, "rank")())


def model_parallel_world_size(mpu) -> int:
    return 1 if mpu is None else int(_mpu_method(mpu, "world_size")())


def model_parallel_group(mpu):
    return None if mpu is None else _mpu_method(mpu, "group")()


# -- configure ------------------------------------------------------------------------------------
def _section_from(deepspeed_config) -> ActivationCheckpointingConfig:
    """The validated `activation_checkpointing` section of whatever config form was given.

    Only that section is validated: a Megatron script hands over its full ds_config, whose other
    sections belong to plugins this function knows nothing about.
    """
    if deepspeed_config is None:
        return ActivationCheckpointingConfig()
    if isinstance(deepspeed_config, ActivationCheckpointingConfig):
        return deepspeed_config
    if isinstance(deepspeed_config, DeepSpeedConfig):
        return deepspeed_config.activation_checkpointing_config
    if not isinstance(deepspeed_config, (dict, str, os.PathLike)):
        raise TypeError(f"deepspeed_config must be a DeepSpeedConfig, a config dict or the path of "
                        f"a JSON config file, got {type(deepspeed_config).__name__}")
    raw = load_config_source(deepspeed_config)
    core, _ = validate_config({SECTION: raw.get(SECTION, {})}, {},
                              describe_source(deepspeed_config))
    return core.activation_checkpointing


def _checked_override(name: str, value):
    if value is None:
        return None
    if name == "num_checkpoints":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"configure(num_checkpoints={value!r}): expected a positive int (the "
                             f"number of checkpoint() calls in one forward pass)")
        return value
    if not isinstance(value, bool):
        raise TypeError(f"configure({name}={value!r}): expected True, False or None (= take it "
                        f"from deepspeed_config)")
    return value


def _check_rules(settings: CheckpointingSettings) -> None:
    """The documented combination rules (AssertionError, as upstream raises them)."""
    if settings.contiguous_checkpointing and not settings.partition_activations:
        raise AssertionError(
            "contiguous checkpointing (contiguous_memory_optimization) is only available with "
            "partitioned activations: set partition_activations to true")
    if settings.contiguous_checkpointing and settings.num_checkpoints is None:
        raise AssertionError(
            "contiguous checkpointing (contiguous_memory_optimization) needs num_checkpoints "
            "(config key number_checkpoints) to size its buffers")


def configure(mpu_=None, deepspeed_config=None, partition_activations=None,
              contiguous_checkpointing=None, num_checkpoints=None, checkpoint_in_cpu=None,
              synchronize=None, profile=None, *, partition_activation=None) -> None:
    """Configure activation checkpointing for this process.

    `deepspeed_config` (a DeepSpeedConfig, a config dict or a JSON file path) supplies the
    `activation_checkpointing` section; every keyword that is not None overrides its key.
    `partition_activation` is the singular spelling the Megatron tutorial uses.
    """
    if partition_activation is not None:
        if partition_activations is not None and partition_activations != partition_activation:
            raise ValueError(f"configure() got partition_activations={partition_activations!r} and "
                             f"its alias partition_activation={partition_activation!r}; give one")
        partition_activations = partition_activation
    if mpu_ is not None:
        for what in _MPU_METHODS:
            _mpu_method(mpu_, what)

    section = _section_from(deepspeed_config)
    values = {kwarg: getattr(section, key) for kwarg, key in KWARG_TO_CONFIG_KEY.items()}
    overrides = {"partition_activations": partition_activations,
                 "contiguous_checkpointing": contiguous_checkpointing,
                 "num_checkpoints": num_checkpoints, "checkpoint_in_cpu": checkpoint_in_cpu,
                 "synchronize": synchronize, "profile": profile}
    for name, value in overrides.items():
        value = _checked_override(name, value)
        if value is not None:
            values[name] = value
    settings = CheckpointingSettings(mpu=mpu_, **values)
    _check_rules(settings)

    _STATE.buffers.release()
    _STATE.settings = settings
    _STATE.buffers = ContiguousBuffers(settings.num_checkpoints
                                       if settings.contiguous_checkpointing else None)
    _STATE.configured = True
