"""``deepspeed.utils.zero_to_fp32``: upstream's import path of the ZeRO consolidation functions.

The real module is ``deepspeed.zero.zero_to_fp32`` (the standalone script a ZeRO save copies
into the checkpoint folder); setup.py maps this folder onto upstream's name (see UPSTREAM_PATHS
there), because ``deepspeed.utils`` is a core package and the core never imports a plugin.
``python -m deepspeed.utils.zero_to_fp32`` runs the script (``__main__``).
"""
from deepspeed.zero.zero_to_fp32 import (LazyTensor, convert_zero_checkpoint_to_fp32_state_dict,
                                         get_fp32_state_dict_from_zero_checkpoint,
                                         load_state_dict_from_zero_checkpoint, main, parse_size)

__all__ = ["get_fp32_state_dict_from_zero_checkpoint", "load_state_dict_from_zero_checkpoint",
           "convert_zero_checkpoint_to_fp32_state_dict", "LazyTensor", "parse_size", "main"]
