"""The import paths the DeepSpeed docs and integrations use for the optimizers."""
import importlib

import pytest
import torch

PATHS = [
    ("deepspeed.ops.adam", "FusedAdam"),
    ("deepspeed.ops.adam", "DeepSpeedCPUAdam"),
    ("deepspeed.ops.adam.fused_adam", "FusedAdam"),
    ("deepspeed.ops.adam.cpu_adam", "DeepSpeedCPUAdam"),
    ("deepspeed.ops.lamb", "FusedLamb"),
    ("deepspeed.ops.lamb.fused_lamb", "FusedLamb"),
    ("deepspeed.ops.lion", "FusedLion"),
    ("deepspeed.ops.lion", "DeepSpeedCPULion"),
    ("deepspeed.ops.lion.fused_lion", "FusedLion"),
    ("deepspeed.ops.lion.cpu_lion", "DeepSpeedCPULion"),
    ("deepspeed.ops.adagrad", "DeepSpeedCPUAdagrad"),
    ("deepspeed.ops.adagrad.cpu_adagrad", "DeepSpeedCPUAdagrad"),
]


@pytest.mark.parametrize("module,name", PATHS)
def test_optimizer_import_path(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, torch.optim.Optimizer)
    assert cls is getattr(importlib.import_module(module.rsplit(".", 1)[0]
                                                  if module.count(".") == 3 else module), name)
