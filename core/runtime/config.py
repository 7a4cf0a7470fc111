"""`deepspeed.runtime.config` -> `deepspeed.config`."""
from deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError  # noqa: F401
