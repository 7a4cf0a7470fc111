"""``deepspeed.moe.layer.MoE`` in one process (ep_size 1): every row of the API reference's
MoE table (capacity, drops, eval capacity, l_aux, exp_counts, used_token, noisy gates, RTS,
Tutel fallback, residual) and the argument errors."""

import pytest
import torch
from torch import nn

from deepspeed.moe import sharded_moe
from deepspeed.moe.gating import capacity
from deepspeed.moe.sharded_moe import top1gating, top2gating
from deepspeed.moe.layer import MoE
from deepspeed.moe.sharded_moe import TopKGate
from moe_helpers import HIDDEN, expert


def _layer(**kwargs):
    torch.manual_seed(0)
    return MoE(HIDDEN, expert(), **{"num_experts": 4, **kwargs})


def _tokens(n=64, seed=1):
    return torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(seed))


def _per_expert_kept(dispatch_mask):
    return dispatch_mask.sum(dim=(0, 2))


# ------------------------------------------------------------------ capacity and dropping
def test_capacity_formula_and_floor():
    assert capacity(64, 4, 1.0, 4) == 16
    assert capacity(16, 4, 1.0, 4) == 4
    assert capacity(10, 4, 1.0, 4) == 4  # ceil(2.5) = 3 raised to the floor
    assert capacity(10, 4, 1.5, 1) == 4  # ceil(3.75)
    assert capacity(8, 4, 1.0, 8) == 8


def test_no_expert_gets_more_than_its_capacity_when_dropping():
    logits = torch.zeros(64, 4)
    logits[:, 0] = 5.0  # every token prefers expert 0
    for rts in (True, False):
        _, combine, dispatch, counts = top1gating(logits, 1.0, 4, use_rts=rts)
        assert combine.shape == (64, 4, 16)
        assert _per_expert_kept(dispatch).tolist() == [16, 0, 0, 0]
        assert counts.tolist() == [64, 0, 0, 0]  # counted before dropping
        assert dispatch.sum(dim=0).max() <= 1  # one token per slot


def test_without_rts_the_first_tokens_are_kept():
    logits = torch.zeros(20, 4)
    logits[:, 2] = 1.0
    _, combine, dispatch, _ = top1gating(logits, 1.0, 4, use_rts=False)
    kept = dispatch.any(dim=2).any(dim=1)
    assert kept.tolist() == [True] * 5 + [False] * 15


def test_rts_is_deterministic_under_a_seed_and_not_positional():
    logits = torch.zeros(64, 4)
    logits[:, 1] = 1.0
    picks = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        picks.append(top1gating(logits, 1.0, 4, use_rts=True)[2].any(dim=2).any(dim=1))
    assert torch.equal(picks[0], picks[1])
    assert not torch.equal(picks[0], picks[2])
    assert picks[0].sum() == 16 and not picks[0][:16].all()


def test_top2_capacity_uses_twice_the_factor():
    logits = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    _, combine, dispatch, counts = top2gating(logits, 1.0, 4, top2_2nd_expert_sampling=False)
    assert combine.shape[2] == 32
    assert counts.sum() == 128  # both choices of every token
    assert _per_expert_kept(dispatch).max() <= 32


def test_drop_tokens_false_routes_every_token():
    layer = _layer(drop_tokens=False)
    logits_bias = torch.zeros(4, HIDDEN)
    logits_bias[0] = 1.0
    with torch.no_grad():
        layer.deepspeed_moe.gate.wg.weight.copy_(logits_bias)
    x = _tokens().abs() + 0.1  # all positive: every token prefers expert 0
    out, _, counts = layer(x)
    assert counts.tolist() == [64, 0, 0, 0]
    assert (out.abs().sum(dim=-1) > 0).all()
    dropping = _layer(drop_tokens=True)
    with torch.no_grad():
        dropping.deepspeed_moe.gate.wg.weight.copy_(logits_bias)
    out_dropped, _, _ = dropping(x)
    assert (out_dropped.abs().sum(dim=-1) == 0).sum() == 64 - 16


def test_eval_uses_eval_capacity_factor():
    gate = TopKGate(HIDDEN, 4, k=1, capacity_factor=1.0, eval_capacity_factor=2.0, min_capacity=1)
    x = _tokens()
    assert gate(x)[1].shape[2] == 16
    gate.eval()
    assert gate(x)[1].shape[2] == 32
    layer = _layer(capacity_factor=1.0, eval_capacity_factor=0.5, min_capacity=1).eval()
    layer(x)
    assert layer.deepspeed_moe.gate(x)[1].shape[2] == 8


# ------------------------------------------------------------------ outputs
def test_output_shape_l_aux_and_exp_counts():
    layer = _layer()
    x = torch.randn(2, 16, HIDDEN)
    out, l_aux, counts = layer(x)
    assert out.shape == x.shape
    assert l_aux.ndim == 0
    assert counts.shape == (4,) and counts.sum() == 32


def test_uniform_gates_give_l_aux_one_for_top1():
    layer = _layer()
    with torch.no_grad():
        layer.deepspeed_moe.gate.wg.weight.zero_()
    _, l_aux, counts = layer(_tokens())
    assert l_aux.item() == pytest.approx(1.0, abs=1e-7)
    assert counts.sum() == 64


def test_l_aux_closed_forms():
    logits = torch.randn(32, 4, generator=torch.Generator().manual_seed(3))
    gates = torch.softmax(logits, dim=1)
    mask1 = nn.functional.one_hot(gates.argmax(dim=1), 4).float()
    l1 = top1gating(logits, 1.0, 4)[0]
    torch.testing.assert_close(l1, (gates.mean(0) * mask1.mean(0)).sum() * 4)
    l2 = top2gating(logits, 1.0, 4)[0]
    torch.testing.assert_close(l2, (gates.mean(0) * mask1.mean(0)).mean() * 16)


def _expert_outputs(layer, x):
    return torch.stack([e(x) for e in layer.deepspeed_moe.experts.deepspeed_experts], dim=1)


def test_top1_output_is_the_chosen_experts_output_times_its_gate():
    layer = _layer(drop_tokens=False)
    x = _tokens(32)
    out, _, _ = layer(x)
    gates = torch.softmax(x @ layer.deepspeed_moe.gate.wg.weight.t(), dim=1)
    choice = gates.argmax(dim=1)
    every = _expert_outputs(layer, x)
    expected = every[torch.arange(32), choice] * gates[torch.arange(32), choice, None]
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_top2_output_mixes_the_two_experts_by_renormalised_gates():
    layer = _layer(k=2, drop_tokens=False, top2_2nd_expert_sampling=False)
    x = _tokens(32)
    out, _, counts = layer(x)
    assert counts.sum() == 64
    gates = torch.softmax(x @ layer.deepspeed_moe.gate.wg.weight.t(), dim=1)
    top = gates.topk(2, dim=1)
    every = _expert_outputs(layer, x)
    rows = torch.arange(32)
    g = top.values / top.values.sum(dim=1, keepdim=True)
    expected = (every[rows, top.indices[:, 0]] * g[:, :1]
                + every[rows, top.indices[:, 1]] * g[:, 1:])
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_used_token_mask_routes_nothing_for_masked_tokens():
    layer = _layer(drop_tokens=False)
    x = torch.randn(2, 8, HIDDEN)
    used = torch.ones(2, 8)
    used[:, 4:] = 0
    out, _, counts = layer(x, used_token=used)
    assert counts.sum() == 8
    assert (out[:, 4:] == 0).all() and (out[:, :4].abs().sum(dim=-1) > 0).all()


# ------------------------------------------------------------------ noise, RTS, Tutel
@pytest.mark.parametrize("policy", ["Jitter", "RSample"])
def test_noisy_gates_run_deterministically_under_a_seed_and_not_in_eval(policy):
    layer = _layer(noisy_gate_policy=policy)
    x = _tokens()
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        runs.append(layer(x)[0])
    torch.testing.assert_close(runs[0], runs[1], atol=0, rtol=0)
    layer.eval()
    plain = _layer(noisy_gate_policy=None).eval()
    torch.manual_seed(6)
    noisy_in_eval = layer(x)[0]
    torch.manual_seed(6)  # the same draws for random token selection
    torch.testing.assert_close(noisy_in_eval, plain(x)[0], atol=0, rtol=0)


def test_none_string_is_no_noise():
    x = _tokens()
    torch.testing.assert_close(_layer(noisy_gate_policy="None", use_rts=False)(x)[0],
                               _layer(noisy_gate_policy=None, use_rts=False)(x)[0], atol=0, rtol=0)


def test_use_rts_layer_is_deterministic_under_a_seed():
    layer = _layer(use_rts=True, capacity_factor=0.5)
    x = _tokens()
    outs = []
    for _ in range(2):
        torch.manual_seed(11)
        outs.append(layer(x)[0])
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)


def test_use_tutel_falls_back_with_one_info(monkeypatch):
    monkeypatch.setattr(sharded_moe, "_TUTEL_NOTED", False)
    messages = []
    monkeypatch.setattr(sharded_moe.logger, "info", messages.append)
    x = _tokens()
    torch.testing.assert_close(_layer(use_tutel=True, use_rts=False)(x)[0],
                               _layer(use_rts=False)(x)[0], atol=0, rtol=0)
    _layer(use_tutel=True)
    assert len(messages) == 1 and "einsum" in messages[0]


# ------------------------------------------------------------------ residual
def test_residual_moe_mixes_dense_mlp_and_experts_by_learned_coefficient():
    layer = _layer(use_residual=True, drop_tokens=False)
    assert isinstance(layer.coefficient, nn.Linear)
    assert (layer.coefficient.in_features, layer.coefficient.out_features) == (HIDDEN, 2)
    x = torch.randn(2, 8, HIDDEN)
    out, _, _ = layer(x)
    moe_out = layer.deepspeed_moe(x)
    coef = torch.softmax(layer.coefficient(x), dim=-1)
    expected = moe_out * coef[..., :1] + layer.mlp(x) * coef[..., 1:]
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    out.sum().backward()
    assert layer.coefficient.weight.grad is not None and layer.mlp[0].weight.grad is not None


def test_experts_are_independent_copies_marked_as_expert_params():
    layer = _layer(num_experts=2)
    experts = layer.deepspeed_moe.experts.deepspeed_experts
    assert len(experts) == 2 and experts[0][0].weight is not experts[1][0].weight
    for param in layer.deepspeed_moe.experts.parameters():
        assert param.allreduce is False and param.group_name == "ep_size_1"
    assert not hasattr(layer.deepspeed_moe.gate.wg.weight, "allreduce")
    names = set(layer.state_dict())
    assert "deepspeed_moe.gate.wg.weight" in names
    assert "deepspeed_moe.experts.deepspeed_experts.1.2.bias" in names


def test_pyramid_layers_with_different_expert_counts_train_together():
    torch.manual_seed(0)
    layers = nn.ModuleList([MoE(HIDDEN, expert(), num_experts=n, use_residual=True)
                            for n in (2, 4)])
    opt = torch.optim.SGD(layers.parameters(), lr=0.05)
    x, y = _tokens(32), _tokens(32, seed=2)
    losses = []
    for _ in range(30):
        h, aux = x, 0.0
        for layer in layers:
            h, l_aux, _ = layer(h)
            aux = aux + l_aux
        loss = nn.functional.mse_loss(h, y) + 0.01 * aux
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


# ------------------------------------------------------------------ errors
def test_num_experts_not_divisible_by_ep_size():
    with pytest.raises(AssertionError,
                       match=r"Number of experts \(3\).*expert parallel size \(2\)"):
        MoE(HIDDEN, nn.Linear(HIDDEN, HIDDEN), num_experts=3, ep_size=2)


@pytest.mark.parametrize("k", [0, 3])
def test_k_other_than_one_or_two(k):
    with pytest.raises(ValueError, match="^Only top-1 and top-2 gatings are supported.$"):
        MoE(HIDDEN, nn.Linear(HIDDEN, HIDDEN), num_experts=2, k=k)


def test_unknown_noisy_gate_policy():
    with pytest.raises(AssertionError, match="'foo'"):
        MoE(HIDDEN, nn.Linear(HIDDEN, HIDDEN), num_experts=2, noisy_gate_policy="foo")


def test_hidden_size_mismatch_names_both_sizes():
    layer = _layer()
    with pytest.raises(ValueError, match=r"hidden_size is 8 .* last dimension is 6"):
        layer(torch.randn(4, 6))


def test_num_experts_list_is_refused_with_a_hint():
    with pytest.raises(TypeError, match="num_experts.*PR-MoE"):
        MoE(HIDDEN, nn.Linear(HIDDEN, HIDDEN), num_experts=[2, 4])


def test_used_token_of_the_wrong_size():
    with pytest.raises(ValueError, match="used_token has 3 entries for 8 tokens"):
        _layer()(torch.randn(8, HIDDEN), used_token=torch.ones(3))


def test_expert_parallelism_without_distributed_backend():
    layer = MoE(HIDDEN, nn.Linear(HIDDEN, HIDDEN), num_experts=2, ep_size=2)
    with pytest.raises(RuntimeError, match="ep_size=2 needs the distributed backend"):
        layer(torch.randn(4, HIDDEN))
