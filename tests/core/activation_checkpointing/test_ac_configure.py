"""`configure()`: config sources, keyword overrides, the documented rules, and what each option
does to a checkpoint call (single process; model-parallel partitioning is in test_ac_partition)."""
import json
import logging

import pytest
import torch

import deepspeed.checkpointing as ckpt
from deepspeed.accelerator import get_accelerator
from deepspeed.activation_checkpointing import settings as ac_settings
from deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError
from deepspeed.utils.logging import logger

DEVICE = get_accelerator().current_device_name()
FULL_SECTION = {"partition_activations": True, "cpu_checkpointing": True,
                "contiguous_memory_optimization": True, "number_checkpoints": 4,
                "synchronize_checkpoint_boundary": True, "profile": True}
ALL_ON = ac_settings.CheckpointingSettings(
    partition_activations=True, contiguous_checkpointing=True, num_checkpoints=4,
    checkpoint_in_cpu=True, synchronize=True, profile=True)


def test_is_configured_only_after_configure():
    assert not ckpt.is_configured()
    ckpt.configure(None)
    assert ckpt.is_configured()
    assert ac_settings.current() == ac_settings.CheckpointingSettings()  # all documented defaults


def test_configure_from_a_config_dict():
    ckpt.configure(deepspeed_config={"activation_checkpointing": FULL_SECTION})
    assert ac_settings.current() == ALL_ON


def test_configure_from_a_json_file_with_other_sections(tmp_path):
    """A Megatron script passes its whole ds_config; sections owned by plugins are not ours to
    validate."""
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {"stage": 1},
                                "activation_checkpointing": FULL_SECTION}))
    ckpt.configure(None, deepspeed_config=str(path))
    assert ac_settings.current() == ALL_ON
    ckpt.configure(None, deepspeed_config=path)  # a pathlib.Path works too
    assert ac_settings.current() == ALL_ON


def test_configure_from_a_deepspeed_config():
    config = DeepSpeedConfig({"train_batch_size": 2, "activation_checkpointing": FULL_SECTION},
                             world_size=1)
    ckpt.configure(deepspeed_config=config)
    assert ac_settings.current() == ALL_ON
    ckpt.configure(deepspeed_config=config.activation_checkpointing_config)
    assert ac_settings.current() == ALL_ON


def test_keywords_override_the_config():
    ckpt.configure(None, deepspeed_config={"activation_checkpointing": FULL_SECTION},
                   partition_activations=True, contiguous_checkpointing=False,
                   checkpoint_in_cpu=False, synchronize=False, profile=False, num_checkpoints=2)
    assert ac_settings.current() == ac_settings.CheckpointingSettings(
        partition_activations=True, num_checkpoints=2)

    ckpt.configure(None, partition_activations=False,
                   deepspeed_config={"activation_checkpointing": {"partition_activations": True}})
    assert ac_settings.current().partition_activations is False


def test_singular_partition_activation_alias():
    ckpt.configure(None, deepspeed_config={}, partition_activation=True)
    assert ac_settings.current().partition_activations is True
    with pytest.raises(ValueError, match="partition_activations=False and its alias"):
        ckpt.configure(None, partition_activations=False, partition_activation=True)


@pytest.mark.parametrize("kwargs,match", [
    ({"contiguous_checkpointing": True, "num_checkpoints": 2}, "only available with partitioned"),
    ({"contiguous_checkpointing": True, "partition_activations": True}, "needs num_checkpoints"),
])
def test_contiguous_rules(kwargs, match):
    with pytest.raises(AssertionError, match=match):
        ckpt.configure(None, **kwargs)
    assert not ckpt.is_configured()  # a rejected call changes nothing


def test_contiguous_rule_applies_to_the_config_too():
    section = {"contiguous_memory_optimization": True, "number_checkpoints": 2}
    with pytest.raises(AssertionError, match="only available with partitioned"):
        ckpt.configure(None, deepspeed_config={"activation_checkpointing": section})


@pytest.mark.parametrize("kwargs,error,match", [
    ({"partition_activations": "yes"}, TypeError, r"partition_activations='yes'"),
    ({"profile": 1}, TypeError, r"profile=1"),
    ({"num_checkpoints": 0}, ValueError, r"num_checkpoints=0.*positive int"),
    ({"num_checkpoints": 2.5}, ValueError, r"num_checkpoints=2.5"),
    ({"deepspeed_config": 42}, TypeError, "deepspeed_config must be"),
    ({"mpu_": object()}, TypeError, "get_model_parallel_rank"),
])
def test_bad_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        ckpt.configure(**kwargs)


@pytest.mark.parametrize("section,match", [
    ({"number_checkpoints": 0}, "activation_checkpointing.number_checkpoints"),
    ({"partition_activations": "maybe"}, "activation_checkpointing.partition_activations"),
    ({"cpu_checkpointing": "auto"}, "activation_checkpointing.cpu_checkpointing"),
])
def test_bad_config_sections_are_named(section, match):
    with pytest.raises(DeepSpeedConfigError, match=match):
        ckpt.configure(deepspeed_config={"activation_checkpointing": section})


# -- what the options do -------------------------------------------------------------------------
def _model_and_input():
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.2), torch.nn.GELU())
              .to(DEVICE) for _ in range(3)]
    return layers, torch.randn(4, 8, device=DEVICE)


def _train(layers, x0, use_checkpoint):
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    get_accelerator().manual_seed(3)
    x = x0.clone().requires_grad_()
    h, outputs = x, []
    for layer in layers:
        h = ckpt.checkpoint(layer, h) if use_checkpoint else layer(h)
        outputs.append(h)
    saved = [t for t in outputs[-1].grad_fn.saved_tensors] if use_checkpoint else []
    h.pow(2).sum().backward()
    return [h.detach(), x.grad] + [p.grad for layer in layers for p in layer.parameters()], saved


@pytest.mark.parametrize("options", [
    {"checkpoint_in_cpu": True},
    {"partition_activations": True},
    {"partition_activations": True, "checkpoint_in_cpu": True},
    {"partition_activations": True, "contiguous_checkpointing": True, "num_checkpoints": 3},
    {"partition_activations": True, "contiguous_checkpointing": True, "num_checkpoints": 3,
     "checkpoint_in_cpu": True},
])
def test_every_memory_option_keeps_gradients_exact(options):
    layers, x0 = _model_and_input()
    ref, _ = _train(layers, x0, False)
    ckpt.configure(None, **options)
    got, saved = _train(layers, x0, True)
    for g, r in zip(got, ref):
        assert torch.equal(g, r)
    assert len(saved) == 1 and saved[0].numel() == x0.numel()  # mp size 1: the whole input
    if options.get("checkpoint_in_cpu"):
        assert saved[0].device.type == "cpu"
    else:
        assert saved[0].device == x0.device


def test_contiguous_buffers_hold_every_checkpoint_of_a_forward():
    layers, x0 = _model_and_input()
    ckpt.configure(None, partition_activations=True, contiguous_checkpointing=True,
                   num_checkpoints=3)
    x = x0.clone().requires_grad_()
    h, saved = x, []
    for layer in layers:
        h = ckpt.checkpoint(layer, h)
        saved.append(h.grad_fn.saved_tensors[0])
    buffers = ac_settings.contiguous_buffers()
    assert len(buffers) == 1  # one buffer: every checkpoint has a single tensor argument
    storage = saved[0].untyped_storage()
    slot_bytes = x0.numel() * x0.element_size()
    assert storage.nbytes() == 3 * slot_bytes
    for i, tensor in enumerate(saved):
        assert tensor.numel() == x0.numel()
        assert tensor.untyped_storage().data_ptr() == storage.data_ptr()
        assert tensor.data_ptr() == storage.data_ptr() + i * slot_bytes
    h.sum().backward()
    assert len(ac_settings.contiguous_buffers()) == 0  # released by the backward pass


def test_too_many_checkpoints_for_the_buffers():
    layers, x0 = _model_and_input()
    ckpt.configure(None, partition_activations=True, contiguous_checkpointing=True,
                   num_checkpoints=2)
    h = x0.clone().requires_grad_()
    for layer in layers[:2]:
        h = ckpt.checkpoint(layer, h)
    with pytest.raises(RuntimeError, match="number_checkpoints=2"):
        ckpt.checkpoint(layers[2], h)


def test_heterogeneous_checkpoints_are_rejected_in_contiguous_mode():
    ckpt.configure(None, partition_activations=True, contiguous_checkpointing=True,
                   num_checkpoints=4)
    x = torch.randn(4, 8, device=DEVICE, requires_grad=True)
    h = ckpt.checkpoint(torch.nn.functional.gelu, x)
    with pytest.raises(AssertionError, match="homogeneous checkpoints: argument 0"):
        ckpt.checkpoint(torch.nn.functional.gelu, torch.cat([h, h]))


def test_reset_after_forward_only_passes():
    layers, x0 = _model_and_input()
    ckpt.configure(None, partition_activations=True, contiguous_checkpointing=True,
                   num_checkpoints=3)
    for _ in range(3):  # evaluation with grad enabled: no backward frees the slots
        h = x0.clone().requires_grad_()
        for layer in layers:
            h = ckpt.checkpoint(layer, h)
        assert len(ac_settings.contiguous_buffers()) == 1
        ckpt.reset()
        assert len(ac_settings.contiguous_buffers()) == 0
    with torch.no_grad():  # nothing is kept without grad, so nothing needs a reset
        for _ in range(3):
            for layer in layers:
                ckpt.checkpoint(layer, x0)
    assert len(ac_settings.contiguous_buffers()) == 0


def test_synchronize_calls_the_accelerator_at_each_boundary(monkeypatch):
    calls = []
    accelerator = get_accelerator()
    original = accelerator.synchronize
    monkeypatch.setattr(accelerator, "synchronize", lambda *a: (calls.append(1), original(*a)))
    x = torch.randn(3, device=DEVICE, requires_grad=True)
    ckpt.checkpoint(torch.sin, x).sum().backward()
    assert calls == []  # off by default
    ckpt.configure(None, synchronize=True)
    ckpt.checkpoint(torch.sin, x).sum().backward()
    assert len(calls) == 4  # start and end of forward, start and end of backward


def test_profile_logs_forward_and_backward_times():
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        x = torch.randn(3, device=DEVICE, requires_grad=True)
        ckpt.checkpoint(torch.sin, x).sum().backward()
        assert not [r for r in records if "activation checkpoint" in r.getMessage()]
        ckpt.configure(None, profile=True)
        ckpt.checkpoint(torch.sin, x).sum().backward()
    finally:
        logger.removeHandler(handler)
    messages = [r.getMessage() for r in records if "activation checkpoint" in r.getMessage()]
    assert len(messages) == 2
    assert "activation checkpoint forward:" in messages[0] and messages[0].endswith(" ms")
    assert "activation checkpoint backward:" in messages[1]
