"""The documented names resolve to the one implementation, whichever path a script imports."""
import importlib

import pytest

import deepspeed
from deepspeed import activation_checkpointing as home

PUBLIC = ["checkpoint", "CheckpointFunction", "configure", "is_configured", "reset",
          "get_cuda_rng_tracker", "CudaRNGStatesTracker", "model_parallel_cuda_manual_seed"]


@pytest.mark.parametrize("path", ["deepspeed.checkpointing",
                                  "deepspeed.runtime.activation_checkpointing.checkpointing"])
@pytest.mark.parametrize("name", PUBLIC)
def test_documented_path_reaches_the_real_home(path, name):
    assert getattr(importlib.import_module(path), name) is getattr(home, name)


def test_attribute_access_after_a_bare_import():
    assert deepspeed.checkpointing.checkpoint is home.checkpoint
