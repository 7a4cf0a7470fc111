"""Small shared helpers (`deepspeed.utils`)."""
from deepspeed.utils.logging import log_dist, logger
from deepspeed.utils.tensor_fragment import (safe_get_full_fp32_param, safe_get_full_grad,
                                             safe_get_full_optimizer_state,
                                             safe_get_local_fp32_param, safe_get_local_grad,
                                             safe_get_local_optimizer_state,
                                             safe_set_full_fp32_param,
                                             safe_set_full_optimizer_state,
                                             safe_set_local_fp32_param,
                                             safe_set_local_optimizer_state)

__all__ = ["logger", "log_dist", "safe_get_full_fp32_param", "safe_get_full_grad",
           "safe_get_full_optimizer_state", "safe_set_full_fp32_param",
           "safe_set_full_optimizer_state", "safe_get_local_fp32_param", "safe_get_local_grad",
           "safe_get_local_optimizer_state", "safe_set_local_fp32_param",
           "safe_set_local_optimizer_state"]
