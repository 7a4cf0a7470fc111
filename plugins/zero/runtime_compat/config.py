"""``deepspeed.runtime.zero.config`` (upstream path) -> ``deepspeed.zero.config``."""
from deepspeed.zero.config import *  # noqa: F401,F403
from deepspeed.zero.config import DeepSpeedZeroConfig, ZeroStageEnum  # noqa: F401
