"""``deepspeed.OnDevice``: a model built inside it lives on the chosen device in the chosen
floating-point dtype; integer tensors and explicit choices are left alone; nothing leaks out."""
import pytest
import torch

import deepspeed
from deepspeed.utils.init_on_device import OnDevice


def test_meta_fp16_model_costs_nothing_and_keeps_integer_dtypes():
    with deepspeed.OnDevice(dtype=torch.float16, device="meta"):
        model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4))
        steps = torch.arange(3)
        explicit = torch.zeros(2, dtype=torch.float32, device="cpu")
    for param in model.parameters():
        assert param.device.type == "meta" and param.dtype == torch.float16
    assert steps.dtype == torch.int64 and steps.device.type == "meta"
    assert explicit.dtype == torch.float32 and explicit.device.type == "cpu"
    real = model.to_empty(device="cpu")
    assert real[1].weight.device.type == "cpu" and real[1].weight.dtype == torch.float16
    # outside the context: the defaults again
    assert torch.zeros(1).dtype == torch.float32 and torch.zeros(1).device.type == "cpu"


def test_real_device_gives_usable_weights_in_the_dtype():
    with OnDevice(dtype=torch.bfloat16, device="cpu"):
        layer = torch.nn.Linear(4, 3)
    assert layer.weight.dtype == torch.bfloat16 and layer.weight.abs().sum() > 0
    assert layer(torch.ones(2, 4, dtype=torch.bfloat16)).shape == (2, 3)


def test_disabled_does_nothing_and_bad_dtype_is_refused():
    with OnDevice(dtype=torch.float16, device="meta", enabled=False):
        layer = torch.nn.Linear(2, 2)
    assert layer.weight.device.type == "cpu" and layer.weight.dtype == torch.float32
    assert deepspeed.utils.OnDevice is deepspeed.OnDevice is OnDevice
    with pytest.raises(ValueError, match="floating-point"):
        OnDevice(dtype=torch.int8)
