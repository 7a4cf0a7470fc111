"""``deepspeed.runtime.zero``: upstream's import paths for ZeRO, re-exporting ``deepspeed.zero``
(setup.py maps this folder there; see RUNTIME_COMPAT)."""
from deepspeed.zero import (GatheredParameters, Init, register_external_parameter,  # noqa: E402
                            unwrap_model_for_generation)

__all__ = ["GatheredParameters", "Init", "register_external_parameter",
           "unwrap_model_for_generation"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
