"""``deepspeed.runtime.zero.stage_1_and_2`` (upstream path): the stage 1/2 optimizer and the
ZeRO-2 memory estimators."""
from deepspeed.zero.estimators import (estimate_zero2_model_states_mem_needs,  # noqa: F401
                                       estimate_zero2_model_states_mem_needs_all_cold,
                                       estimate_zero2_model_states_mem_needs_all_live)
from deepspeed.zero.stage_1_and_2 import DeepSpeedZeroOptimizer  # noqa: F401
