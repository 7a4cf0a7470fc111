"""`deepspeed.runtime.precision_config`: upstream's home of the ``fp16`` / ``bf16`` section
models, which are the core config's (``deepspeed.config.core_sections``)."""
from deepspeed.config.core_sections import BF16Config as DeepSpeedBF16Config
from deepspeed.config.core_sections import FP16Config as DeepSpeedFP16Config


def get_float16_config(param_dict):
    """The validated ``fp16`` section of a whole config dict (defaults when absent)."""
    return DeepSpeedFP16Config(**(param_dict.get("fp16") or {}))


def get_bfloat16_config(param_dict):
    """The validated ``bf16`` section (or its older spelling ``bfloat16``) of a config dict."""
    section = param_dict.get("bf16", param_dict.get("bfloat16"))
    return DeepSpeedBF16Config(**(section or {}))


__all__ = ["DeepSpeedFP16Config", "DeepSpeedBF16Config", "get_float16_config",
           "get_bfloat16_config"]
