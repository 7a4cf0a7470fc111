"""``deepspeed.runtime.zero.tiling`` (upstream path): memory-centric tiling."""
from deepspeed.zero.tiling import (TiledLinear, TiledLinearReturnBias,  # noqa: F401
                                   split_tensor_along_last_dim)
