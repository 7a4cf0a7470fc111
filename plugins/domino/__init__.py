"""``deepspeed.domino``: Domino, tensor-parallel training whose all-reduces hide behind
computation (upstream ``deepspeed.runtime.domino``).

Plain tensor parallelism stops after every attention and MLP block to all-reduce the partial
sums. Domino cuts the batch into pieces and interleaves them, so the all-reduce of one piece
travels while the other piece computes (``transformer``); in backward each column-parallel
Linear's input-gradient all-reduce travels while its weight gradient is computed (``layers``).
It builds on the tensor-parallel plugin's layers and tensor x data parallel groups
(``deepspeed.tensor_parallel.init_tensor_parallel_groups``), and needs them: without tensor
parallelism it refuses to build. ``record_overlap()`` traces launches, waits and compute.
"""
from deepspeed.domino.config import DominoConfig
from deepspeed.domino.layers import DominoAsyncColumnParallelLinear, RowParallelLinearNoComm
from deepspeed.domino.overlap import OverlapTrace, PendingAllReduce, record_overlap
from deepspeed.domino.state import load_unsplit_state_dict
from deepspeed.domino.transformer import DominoTransformer, DominoTransformerLayer, split_batch

__all__ = ["DominoAsyncColumnParallelLinear", "DominoConfig", "DominoTransformer",
           "DominoTransformerLayer", "OverlapTrace", "PendingAllReduce", "RowParallelLinearNoComm",
           "load_unsplit_state_dict", "record_overlap", "split_batch"]

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
