"""``deepspeed.runtime.domino`` (upstream path) -> ``deepspeed.domino``."""
from deepspeed.domino import (DominoAsyncColumnParallelLinear, DominoTransformer,  # noqa: F401
                              DominoTransformerLayer, RowParallelLinearNoComm)
