"""Per-rank random-number state, so a resumed run draws the same dropout masks and data order.

Each rank's generators have drifted apart by the time of a save (different data, different
dropout), so every rank stores its own. Values are plain lists and tensors, never numpy arrays,
so the file loads with ``weights_only=True``.
"""
import random

import numpy as np
import torch

from deepspeed.accelerator import get_accelerator


def _accelerator_has_own_rng():
    """The CPU accelerator's RNG *is* torch's CPU generator: storing it twice would be waste."""
    return get_accelerator().device_name() != "cpu"


def capture_rng_state():
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if _accelerator_has_own_rng():
        state["accelerator"] = get_accelerator().get_rng_state()
    return state


def _as_tuples(value):
    """``random.setstate`` wants the exact nested tuples ``getstate`` gave."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuples(v) for v in value)
    return value


def restore_rng_state(state):
    """Set every generator ``state`` names; a missing entry leaves that generator alone."""
    if "python" in state:
        random.setstate(_as_tuples(state["python"]))
    if "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "accelerator" in state and _accelerator_has_own_rng():
        get_accelerator().set_rng_state(state["accelerator"])
