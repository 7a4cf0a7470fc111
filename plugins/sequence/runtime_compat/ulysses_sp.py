"""Upstream path `deepspeed.runtime.sequence_parallel.ulysses_sp` (used by Accelerate and the
ALST tutorial); the code lives in `deepspeed.sequence`."""
from deepspeed.sequence.dataloader import UlyssesSPDataLoaderAdapter  # noqa: F401
from deepspeed.sequence.tiling import (  # noqa: F401
    SequenceTiledCompute, TiledFusedLogitsLoss, TiledMLP, sequence_tiled_compute,
    tiled_mlp_num_shards)
from deepspeed.sequence.ulysses_hf import UlyssesSPAttentionHF  # noqa: F401
from deepspeed.sequence.offload import (  # noqa: F401
    get_checkpoint_hidden_states_offloading_ctx_manager)

__all__ = ["UlyssesSPAttentionHF", "UlyssesSPDataLoaderAdapter", "TiledMLP",
           "SequenceTiledCompute", "sequence_tiled_compute", "TiledFusedLogitsLoss",
           "tiled_mlp_num_shards", "get_checkpoint_hidden_states_offloading_ctx_manager"]
