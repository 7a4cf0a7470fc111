"""Upstream's precision names as client code uses them: the optimizer-name constants of
``deepspeed.runtime.config``, ``deepspeed.runtime.precision_config``, ``CheckOverflow``, and
the optimizers an fp16 / bf16 engine exposes (``FP16_Optimizer`` / ``BF16_Optimizer``)."""
import pytest
import torch

from deepspeed.config import DeepSpeedConfig
from deepspeed.runtime import config as runtime_config
from deepspeed.runtime.precision_config import (DeepSpeedBF16Config, DeepSpeedFP16Config,
                                                get_bfloat16_config, get_float16_config)
from deepspeed.runtime.utils import CheckOverflow


def _built(optimizer_section):
    from deepspeed.optimizers import build_optimizer

    config = DeepSpeedConfig({"train_batch_size": 1, "optimizer": optimizer_section},
                             world_size=1)
    return build_optimizer(None, config, list(torch.nn.Linear(2, 2).parameters()))


def test_optimizer_name_constants_are_the_names_optimizer_type_accepts():
    c = runtime_config
    assert (c.ADAM_OPTIMIZER, c.ADAMW_OPTIMIZER, c.LAMB_OPTIMIZER, c.LION_OPTIMIZER,
            c.ADAGRAD_OPTIMIZER) == ("adam", "adamw", "lamb", "lion", "adagrad")
    assert c.ADAM_OPTIMIZER in c.DEEPSPEED_OPTIMIZERS
    plain_adam = _built({"type": c.ADAM_OPTIMIZER,
                         "params": {c.TORCH_ADAM_PARAM: True, c.ADAM_W_MODE: False, "lr": 0.1}})
    assert type(plain_adam) is torch.optim.Adam
    assert type(_built({"type": c.ADAMW_OPTIMIZER, "params": {c.TORCH_ADAM_PARAM: True}})) is \
        torch.optim.AdamW
    # a plugin's names are that plugin's exports (the 1-bit optimizers')
    assert c.ONEBIT_ADAM_OPTIMIZER == "onebitadam" and c.ZERO_ONE_ADAM_OPTIMIZER == "zerooneadam"
    assert c.DeepSpeedConfig is DeepSpeedConfig


def test_precision_config_sections():
    fp16 = get_float16_config({"fp16": {"enabled": True, "initial_scale_power": 8}})
    assert isinstance(fp16, DeepSpeedFP16Config) and fp16.enabled
    assert (fp16.initial_scale_power, fp16.loss_scale_window, fp16.hysteresis) == (8, 1000, 2)
    assert get_float16_config({}).enabled is False
    assert get_bfloat16_config({"bfloat16": {"enabled": True}}).enabled  # older spelling
    assert isinstance(get_bfloat16_config({"bf16": {"enabled": False}}), DeepSpeedBF16Config)
    with pytest.raises(ValueError, match="loss_scale_window"):
        get_float16_config({"fp16": {"loss_scale_window": 0}})


def test_check_overflow_on_this_rank():
    layer = torch.nn.Linear(3, 2)
    layer(torch.ones(1, 3)).sum().backward()
    check = CheckOverflow([list(layer.parameters())])
    assert check.check() is False and check.has_overflow_serial(layer.parameters()) is False
    layer.bias.grad[0] = float("inf")
    assert check.check() is True
    layer.bias.grad[0] = float("nan")
    assert check.check([[layer.bias]]) is True and check.check([[layer.weight]]) is False
    assert CheckOverflow._has_inf_or_nan(torch.tensor([1.0, float("-inf")]))
    assert check.check_using_norm([1.0, 2.0]) is False
    assert check.check_using_norm([1.0, -1]) and check.check_using_norm([float("inf")])


def _precision_engines():
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer

    rank = dist.get_rank()
    layer = torch.nn.Linear(3, 2)
    layer(torch.ones(1, 3)).sum().backward()
    if rank == 1:
        layer.weight.grad[0, 0] = float("inf")
    out = {"any_rank": CheckOverflow([list(layer.parameters())], zero_reduce_scatter=True).check(),
           "this_rank": CheckOverflow([list(layer.parameters())]).check(),
           "every_rank": CheckOverflow().has_overflow(list(layer.parameters()),
                                                      has_moe_params=True)}

    engines = {}
    for name, precision in (("fp16", {"fp16": {"enabled": True, "initial_scale_power": 8,
                                               "hysteresis": 1}}),
                            ("bf16", {"bf16": {"enabled": True}})):
        engine, optimizer, *_ = deepspeed.initialize(model=torch.nn.Linear(3, 2), config={
            "train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, **precision})
        engines[name] = engine
        out[name + "_type"] = (isinstance(optimizer, FP16_Optimizer),
                               isinstance(optimizer, BF16_Optimizer))
    engine = engines["fp16"]
    x = torch.ones(1, 3, dtype=torch.float16)
    loss = engine(x).float().sum() * (float("inf") if rank == 1 else 1.0)
    engine.backward(loss)
    before = engine.module.weight.detach().clone()
    engine.step()
    out["fp16_skipped"] = (torch.equal(before, engine.module.weight), engine.skipped_steps,
                           engine.optimizer.cur_scale)
    return out


def test_fp16_and_bf16_engines_expose_upstreams_optimizer_classes(dist_pool):
    for rank, out in enumerate(dist_pool.run(_precision_engines)):
        assert out["any_rank"] is True and out["this_rank"] is (rank == 1)
        assert out["every_rank"] is True
        assert out["fp16_type"] == (True, False) and out["bf16_type"] == (False, True)
        # rank 1 overflowed: both ranks skip the step and halve the scale (hysteresis 1)
        assert out["fp16_skipped"] == (True, 1, 2.0 ** 7)
