"""Checkpoint fixtures for plugin authors' tests.

``write_pre_stateful_layout`` turns a checkpoint into the layout written before the
``deepspeed_stateful`` hook existed, when each plugin put its entries at the top level of the
model-states file itself, so a test can show that such checkpoints still load.
"""
import glob
import os

import torch

from deepspeed.checkpoint.model_state import PLUGIN_STATES


def write_pre_stateful_layout(checkpoint_dir):
    """Rewrite every ``mp_rank_XX_model_states.pt`` under ``checkpoint_dir`` (``save_dir/tag``):
    each plugin's Stateful entries move from ``plugin_states[plugin][name]`` to the top-level
    key ``name`` and ``plugin_states`` goes. Call it on one rank, then barrier. Returns the
    names moved."""
    moved = set()
    for path in sorted(glob.glob(os.path.join(os.fspath(checkpoint_dir),
                                              "mp_rank_*_model_states.pt"))):
        state = torch.load(path, map_location="cpu", weights_only=True)
        for entries in state.pop(PLUGIN_STATES).values():
            state.update(entries)
            moved |= set(entries)
        torch.save(state, path)
    return sorted(moved)
