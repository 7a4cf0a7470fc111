"""``deepspeed.runtime.domino.transformer`` (upstream path) -> ``deepspeed.domino.transformer``."""
from deepspeed.domino.layers import (DominoAsyncColumnParallelLinear,  # noqa: F401
                                     RowParallelLinearNoComm)
from deepspeed.domino.transformer import DominoTransformer, DominoTransformerLayer  # noqa: F401
