"""Expert-parameter helpers (``deepspeed.moe.utils``), the expert group layout in
``deepspeed.utils.groups`` and when the ``moe`` plugin switches itself on."""
import pytest
import torch
from torch import nn

from deepspeed.moe.layer import MoE
from deepspeed.moe.plugin import MoEPlugin, check_moe_compatible
from deepspeed.moe.utils import (has_moe_layers, is_moe_param,
                                 split_params_grads_into_shared_and_expert_params,
                                 split_params_into_different_moe_groups_for_optimizer)
from deepspeed.utils import groups


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), MoE(8, nn.Linear(8, 8), num_experts=2))


def test_is_moe_param_and_has_moe_layers():
    model = _model()
    marked = [name for name, p in model.named_parameters() if is_moe_param(p)]
    assert marked == ["1.deepspeed_moe.experts.deepspeed_experts.0.weight",
                      "1.deepspeed_moe.experts.deepspeed_experts.0.bias",
                      "1.deepspeed_moe.experts.deepspeed_experts.1.weight",
                      "1.deepspeed_moe.experts.deepspeed_experts.1.bias"]
    assert has_moe_layers(model) == (True, [2])
    assert has_moe_layers(nn.Linear(2, 2)) == (False, [])


def test_split_into_moe_param_groups_keeps_settings_and_marks_moe():
    model = _model()
    groups_out = split_params_into_different_moe_groups_for_optimizer(
        {"params": model.parameters(), "name": "parameters", "lr": 0.5, "weight_decay": 0.1})
    assert [g["name"] for g in groups_out] == ["parameters", "ep_size_1"]
    dense, experts = groups_out
    assert "moe" not in dense and experts["moe"] is True
    assert experts["lr"] == 0.5 and experts["weight_decay"] == 0.1
    assert len(dense["params"]) == 3 and len(experts["params"]) == 4
    assert all(is_moe_param(p) for p in experts["params"])
    torch.optim.SGD(groups_out, lr=0.1)  # a valid param-group list


def test_split_cuts_expert_groups_at_max_group_size_and_accepts_lists():
    model = _model()
    out = split_params_into_different_moe_groups_for_optimizer(
        [{"params": list(model.parameters()), "name": "p"}], max_group_size=72)
    sizes = [sum(p.numel() for p in g["params"]) for g in out if g.get("moe")]
    assert sizes == [72, 72]  # weight 64 + bias 8 per expert
    with pytest.raises(ValueError, match="Unknown param group type"):
        split_params_into_different_moe_groups_for_optimizer(iter([]))


def test_split_params_grads_into_shared_and_expert():
    model = _model()
    out, l_aux, _ = model[1](model[0](torch.randn(4, 8)))
    (out.sum() + l_aux).backward()
    shared, expert = split_params_grads_into_shared_and_expert_params(list(model.parameters()))
    assert len(shared) == 3 and len(expert) >= 1


def test_expert_group_layout():
    assert groups._expert_layout(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert groups._expert_layout(4, 4) == ([[0, 1, 2, 3]], [[0], [1], [2], [3]])
    assert groups._expert_layout(4, 1) == ([[0], [1], [2], [3]], [[0, 1, 2, 3]])
    assert groups._expert_layout(4, 2, use_data_before_expert_parallel_=True) == \
        ([[0, 2], [1, 3]], [[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="expert parallel size 3 must divide .* world size 4"):
        groups._expert_layout(4, 3)
    with pytest.raises(RuntimeError, match="no expert-parallel group named 'ep_size_8'"):
        groups._get_expert_parallel_group("ep_size_8")


class _Config:
    def __init__(self, stage=None, clip=0.0):
        self.stage, self.gradient_clipping = stage, clip

    def has_section(self, key):
        return key == "zero_optimization" and self.stage is not None

    def section(self, key):
        return type("Zero", (), {"stage": self.stage})()


def test_plugin_takes_part_for_models_holding_moe_layers():
    plugin = MoEPlugin()
    assert plugin.is_enabled(_Config(stage=2, clip=1.0), []) is False  # never by config
    assert plugin.deepspeed_enable_for_model(_model()) is True
    assert plugin.deepspeed_enable_for_model(torch.nn.Linear(2, 2)) is False


def test_ep_size_one_layers_need_no_refusal():
    check_moe_compatible(_model(), 2, 1.0)  # nothing raised
