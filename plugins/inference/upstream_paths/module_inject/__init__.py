"""``deepspeed.module_inject``: upstream's path of AutoTP and its tensor-parallel layers; the
real homes are ``deepspeed.inference.auto_tp`` and ``deepspeed.inference.layers``."""
from deepspeed.inference.auto_tp import AutoTP
from deepspeed.inference.layers import LinearAllreduce, LinearLayer
from deepspeed.module_inject.replace_module import replace_transformer_layer

__all__ = ["AutoTP", "LinearAllreduce", "LinearLayer", "replace_transformer_layer"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
