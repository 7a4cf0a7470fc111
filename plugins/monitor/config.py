"""The monitor's config sections: ``tensorboard``, ``wandb``, ``csv_monitor`` and ``comet``.

Each backend has its own top-level key, and each is off unless ``enabled: true``, so a config may
carry a backend's settings while it is switched off. ``DeepSpeedMonitorConfig`` bundles the four
for ``MonitorMaster``; it is enabled when any one of them is.
"""
import re
from typing import Any, Mapping, Optional

from pydantic import Field, field_validator

from deepspeed.config import DeepSpeedConfigModel

DEFAULT_JOB_NAME = "DeepSpeedJobName"


# the tests named in the key-effect table (``tested_by``, see deepspeed.config.model)
MASTER = "tests/plugins/monitor/test_monitor_master.py::"
KEYS = "tests/plugins/monitor/test_monitor_keys.py::"


class TensorBoardConfig(DeepSpeedConfigModel):
    """Scalars to TensorBoard event files under ``output_path/job_name``."""

    tested_by = dict.fromkeys(("enabled", "output_path", "job_name"),
                              MASTER + "test_tensorboard_backend_writes_readable_scalars")

    enabled: bool = False
    output_path: Optional[str] = ""
    job_name: str = DEFAULT_JOB_NAME


class WandbConfig(DeepSpeedConfigModel):
    """Scalars to a Weights & Biases run; ``team`` is the W&B entity."""

    tested_by = dict.fromkeys(("enabled", "group", "team", "project"),
                              KEYS + "test_every_wandb_key_reaches_wandb_init")

    enabled: bool = False
    group: Optional[str] = None
    team: Optional[str] = None
    project: str = "deepspeed"


class CSVConfig(DeepSpeedConfigModel):
    """One CSV file per event name under ``output_path/job_name``."""

    tested_by = dict.fromkeys(("enabled", "output_path", "job_name"),
                              MASTER + "test_user_events_go_to_one_csv_file_per_name")

    enabled: bool = False
    output_path: Optional[str] = ""
    job_name: str = DEFAULT_JOB_NAME


class CometConfig(DeepSpeedConfigModel):
    """Scalars to a Comet experiment. ``online: false`` keeps the experiment on disk
    (``comet_ml`` offline mode); ``samples_log_interval`` throttles each series to at most one
    point per that many samples."""

    tested_by = {
        **dict.fromkeys(("enabled", "project", "workspace", "api_key", "experiment_name",
                         "experiment_key", "online", "mode"),
                        KEYS + "test_every_comet_key_reaches_comet_ml_start"),
        "samples_log_interval": KEYS + "test_comet_samples_log_interval_throttles_each_series",
    }

    enabled: bool = False
    samples_log_interval: int = Field(100, gt=0)
    project: Optional[str] = None
    workspace: Optional[str] = None
    api_key: Optional[str] = None
    experiment_name: Optional[str] = None
    experiment_key: Optional[str] = None
    online: Optional[bool] = None
    mode: Optional[str] = None

    @field_validator("experiment_key")
    @classmethod
    def _check_key(cls, value):
        if value is not None and not re.fullmatch(r"[A-Za-z0-9]{32,50}", value):
            raise ValueError(f"comet.experiment_key must be 32 to 50 letters or digits, got {value!r}")
        return value

    @field_validator("mode")
    @classmethod
    def _check_mode(cls, value):
        allowed = ("get", "create", "get_or_create")
        if value is not None and value not in allowed:
            raise ValueError(f"comet.mode must be one of {allowed}, got {value!r}")
        return value


SECTIONS = {"tensorboard": TensorBoardConfig, "wandb": WandbConfig, "csv_monitor": CSVConfig,
            "comet": CometConfig}


class DeepSpeedMonitorConfig(DeepSpeedConfigModel):
    """All four backends' sections; what ``DeepSpeedConfig.monitor_config`` stands for."""

    tensorboard: TensorBoardConfig = Field(default_factory=TensorBoardConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    csv_monitor: CSVConfig = Field(default_factory=CSVConfig)
    comet: CometConfig = Field(default_factory=CometConfig)

    @property
    def enabled(self) -> bool:
        return any(getattr(self, key).enabled for key in SECTIONS)


def _section_of(config, key: str):
    """The validated ``key`` section of a ``DeepSpeedConfig`` (or None when absent). A config
    built without the monitor plugin's sections still carries the raw section, validated here."""
    try:
        section = config.section(key)
    except KeyError:
        section = None
    if isinstance(section, SECTIONS[key]):
        return section
    raw = getattr(config, "raw", {}).get(key)
    return None if raw is None else SECTIONS[key](**raw)


def _as_section(key: str, value):
    """A section model of ``key`` from a validated model or an attribute namespace."""
    return value if isinstance(value, SECTIONS[key]) else SECTIONS[key](**vars(value))


def get_monitor_config(config: Any) -> DeepSpeedMonitorConfig:
    """A ``DeepSpeedMonitorConfig`` from a ``DeepSpeedConfig`` or its ``monitor_config``, a
    whole-config dict (only the four monitor keys are read), or a ``DeepSpeedMonitorConfig``
    (returned as is)."""
    if isinstance(config, DeepSpeedMonitorConfig):
        return config
    if isinstance(config, Mapping):
        return DeepSpeedMonitorConfig(**{key: config[key] for key in SECTIONS
                                         if config.get(key) is not None})
    if all(hasattr(config, key) for key in SECTIONS):  # DeepSpeedConfig.monitor_config
        return DeepSpeedMonitorConfig(**{key: _as_section(key, getattr(config, key))
                                         for key in SECTIONS})
    if hasattr(config, "section"):
        found = {key: _section_of(config, key) for key in SECTIONS}
        return DeepSpeedMonitorConfig(**{key: value for key, value in found.items()
                                         if value is not None})
    raise TypeError(f"MonitorMaster needs a DeepSpeedConfig, a config dict or a "
                    f"DeepSpeedMonitorConfig, got {type(config).__name__}")
