"""Upstream package ``deepspeed.runtime.fp16``: here only as the parent of ``onebit`` (the
1-bit optimizers' upstream home). Should core ever need ``deepspeed.runtime.fp16.*`` (the
loss scaler's upstream path), this package moves to core and onebit keeps the ``onebit`` folder."""

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
