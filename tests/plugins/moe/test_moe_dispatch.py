"""``MOELayer``'s index dispatch and combine against the one-hot einsum formulation (upstream's
``einsum("sec,sm->ecm", dispatch_mask, tokens)`` and ``einsum("sec,ecm->sm", combine_weights,
expert_out)``), computed here from the same gate output: forward output and the gradients to
the input, the gate's and the experts' weights, with top-1/top-2 and tokens dropped or not."""

import pytest
import torch

from deepspeed.moe import sharded_moe
from deepspeed.moe.layer import MoE
from moe_helpers import HIDDEN, expert


def _einsum_forward(moe, tokens, used_token=None):
    """``MOELayer.forward`` as the einsums do it (ep_size 1: no exchange)."""
    _, combine_weights, dispatch_mask, _ = moe.gate(tokens, used_token)
    dispatched = torch.einsum("sec,sm->ecm", dispatch_mask.to(tokens.dtype), tokens)
    expert_out = moe.experts(dispatched.reshape(1, moe.num_local_experts, -1, HIDDEN))
    expert_out = expert_out.reshape(moe.num_local_experts, -1, HIDDEN)
    return torch.einsum("sec,ecm->sm", combine_weights.to(expert_out.dtype), expert_out)


def _forward_and_grads(layer, run, x):
    for p in layer.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    torch.manual_seed(7)  # the same RTS / second-expert sampling on both sides
    out = run(x)
    # a loss that weighs every output element differently, so no gradient can hide
    (out * torch.linspace(-1.0, 2.0, out.numel()).reshape(out.shape)).sum().backward()
    grads = {name: p.grad.clone() for name, p in layer.named_parameters() if p.grad is not None}
    return out.detach(), x.grad.clone(), grads


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("drop_tokens", [True, False])
@pytest.mark.parametrize("used", [False, True])
def test_index_dispatch_equals_einsum_formulation(k, drop_tokens, used):
    torch.manual_seed(0)
    # capacity factor 0.5: with drop_tokens about half the choices do not fit
    layer = MoE(HIDDEN, expert(), num_experts=4, k=k, capacity_factor=0.5, min_capacity=1,
                drop_tokens=drop_tokens, use_rts=True)
    moe = layer.deepspeed_moe
    x = torch.randn(64, HIDDEN, generator=torch.Generator().manual_seed(3))
    used_token = None
    if used:
        used_token = torch.ones(64)
        used_token[::3] = 0

    torch.manual_seed(7)
    _, _, dispatch_mask, counts = moe.gate(x, used_token)
    kept = int(dispatch_mask.sum())
    if drop_tokens:
        assert 0 < kept < int(counts.sum())  # some choices were dropped
    else:
        assert kept == int(counts.sum())

    got = _forward_and_grads(layer, lambda t: moe(t, used_token), x)
    ref = _forward_and_grads(layer, lambda t: _einsum_forward(moe, t, used_token), x)
    torch.testing.assert_close(got[0], ref[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got[1], ref[1], atol=1e-6, rtol=1e-6)
    assert got[2].keys() == ref[2].keys() and "deepspeed_moe.gate.wg.weight" in got[2]
    for name in ref[2]:
        torch.testing.assert_close(got[2][name], ref[2][name], atol=1e-6, rtol=1e-6, msg=name)


@pytest.mark.parametrize("k", [1, 2])
def test_routing_read_off_the_masks_equals_the_gates_routing(k):
    """A gate returning only upstream's 4-tuple still dispatches right (routing from masks)."""
    torch.manual_seed(0)
    layer = MoE(HIDDEN, expert(), num_experts=4, k=k, capacity_factor=0.5, min_capacity=1)
    moe = layer.deepspeed_moe
    x = torch.randn(48, HIDDEN, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(7)
    gated = moe.gate(x)
    from_gate, from_masks = gated.routing, sharded_moe.routing_from_masks(gated[1], gated[2])
    torch.manual_seed(7)
    expected = moe(x)

    class PlainGate(torch.nn.Module):
        def forward(self, tokens, used_token=None):
            return tuple(gated)

    moe.gate = PlainGate()
    torch.testing.assert_close(moe(x), expected, atol=0, rtol=0)
    assert _kept_pairs(from_gate, gated[1].shape[2]) == _kept_pairs(from_masks, gated[1].shape[2])


def _kept_pairs(routing, slots):
    """{(token, flat slot, weight)} of the kept choices, whatever their order."""
    flat = routing.experts * slots + routing.locations
    return {(s, int(flat[c, s]), float(routing.weights.detach()[c, s]))
            for c in range(routing.weights.shape[0])
            for s in (routing.weights[c] != 0).nonzero().flatten().tolist()}
