"""``deepspeed.runtime.domino`` (upstream path) -> ``deepspeed.domino``."""
from deepspeed.domino import (DominoAsyncColumnParallelLinear, DominoTransformer,  # noqa: F401
                              DominoTransformerLayer, RowParallelLinearNoComm)

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
