"""Upstream path of ``deepspeed.sparse_attention`` (the plugin is the real home)."""
from deepspeed.sparse_attention import *  # noqa: F401,F403
from deepspeed.sparse_attention import __all__  # noqa: F401

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
