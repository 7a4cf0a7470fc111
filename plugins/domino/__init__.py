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
from deepspeed.utils.lazy_exports import lazy_exports

# imported on first access, so that loading the plugin (the launcher does, for its flags) or
# reading the config schema imports no torch
_EXPORTS = {
    "DominoConfig": "deepspeed.domino.config",
    "DominoAsyncColumnParallelLinear": "deepspeed.domino.layers",
    "RowParallelLinearNoComm": "deepspeed.domino.layers",
    "OverlapTrace": "deepspeed.domino.overlap",
    "PendingAllReduce": "deepspeed.domino.overlap",
    "record_overlap": "deepspeed.domino.overlap",
    "load_unsplit_state_dict": "deepspeed.domino.state",
    "DominoTransformer": "deepspeed.domino.transformer",
    "DominoTransformerLayer": "deepspeed.domino.transformer",
    "split_batch": "deepspeed.domino.transformer",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
