"""Upstream path `deepspeed.runtime.sequence_parallel.ulysses_sp` (used by Accelerate and the
ALST tutorial); the code lives in `deepspeed.sequence`."""
from deepspeed.sequence.dataloader import UlyssesSPDataLoaderAdapter  # noqa: F401
from deepspeed.sequence.ulysses_hf import UlyssesSPAttentionHF  # noqa: F401

__all__ = ["UlyssesSPAttentionHF", "UlyssesSPDataLoaderAdapter"]
