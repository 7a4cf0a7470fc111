"""`deepspeed.runtime.config_utils` -> `deepspeed.config`."""
from deepspeed.config import DeepSpeedConfigModel  # noqa: F401
