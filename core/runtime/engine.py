"""`deepspeed.runtime.engine` -> `deepspeed.engine`."""
from deepspeed.engine import DeepSpeedEngine  # noqa: F401
