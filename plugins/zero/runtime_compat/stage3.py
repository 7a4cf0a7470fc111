"""``deepspeed.runtime.zero.stage3`` (upstream path): the ZeRO-3 memory estimators."""
from deepspeed.zero.estimators import (estimate_zero3_model_states_mem_needs,  # noqa: F401
                                       estimate_zero3_model_states_mem_needs_all_cold,
                                       estimate_zero3_model_states_mem_needs_all_live)
