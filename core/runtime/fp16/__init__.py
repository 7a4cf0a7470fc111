"""Upstream package ``deepspeed.runtime.fp16``: the fp16 optimizer wrapper and loss scalers
under their upstream paths (``fused_optimizer``, ``loss_scaler``); the real homes are in
``deepspeed.precision``. ``deepspeed.runtime.fp16.onebit`` is the onebit plugin's shim."""

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
