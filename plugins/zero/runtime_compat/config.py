"""``deepspeed.runtime.zero.config`` (upstream path) -> ``deepspeed.zero.config``; the API
reference documents the offload sections' models here too, so they are re-exported with it."""
from deepspeed.zero.config import *  # noqa: F401,F403
from deepspeed.zero.config import DeepSpeedZeroConfig, ZeroStageEnum  # noqa: F401
from deepspeed.zero.offload_config import (DeepSpeedZeroOffloadOptimizerConfig,  # noqa: F401
                                           DeepSpeedZeroOffloadParamConfig, OffloadDeviceEnum)
