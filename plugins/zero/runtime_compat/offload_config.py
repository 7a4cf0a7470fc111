"""``deepspeed.runtime.zero.offload_config`` (upstream path) -> ``deepspeed.zero.offload_config``."""
from deepspeed.zero.offload_config import *  # noqa: F401,F403
from deepspeed.zero.offload_config import (DeepSpeedZeroOffloadOptimizerConfig,  # noqa: F401
                                           DeepSpeedZeroOffloadParamConfig, OffloadDeviceEnum)
