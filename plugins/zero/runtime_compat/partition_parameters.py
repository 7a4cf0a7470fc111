"""``deepspeed.runtime.zero.partition_parameters`` (upstream path): ZeRO-3 construction and
gathering APIs.

This path is the SAME module object as ``deepspeed.zero.partition_parameters``, not a copy of
its names: callers monkeypatch module attributes here (transformers swaps
``zero_wrapper_for_fp_tensor_constructor`` around ``from_pretrained``) and ``Init`` must see it.
"""
import sys

from deepspeed.zero import partition_parameters as _impl
from deepspeed.zero.gathered_parameters import GatheredParameters
from deepspeed.zero.stage3 import register_external_parameter, unregister_external_parameter

# names upstream exposes from this module that live elsewhere in our plugin
_impl.GatheredParameters = GatheredParameters
_impl.register_external_parameter = register_external_parameter
_impl.unregister_external_parameter = unregister_external_parameter
sys.modules[__name__] = _impl
