"""TiledMLP equals the untiled MLP: outputs, input and parameter gradients."""
import pytest
import torch

from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP, tiled_mlp_num_shards

HIDDEN = 8


class _MLP(torch.nn.Module):
    """Llama-style gated MLP."""

    def __init__(self, hidden=HIDDEN, inner=24):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.up_proj = torch.nn.Linear(hidden, inner, bias=False)
        self.down_proj = torch.nn.Linear(inner, hidden, bias=True)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def _mlp_forward(self, x):
    return _MLP.forward(self, x)


def _run(tiled, seqlen, shards, seed=0, compute_params=True):
    torch.manual_seed(seed)
    mlp = _MLP().double()
    x = torch.randn(2, seqlen, HIDDEN, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, seqlen, HIDDEN, dtype=torch.float64)
    if tiled:
        params = list(mlp.parameters()) if compute_params else None
        out = TiledMLP.apply(_mlp_forward, mlp, x, shards, params)
    else:
        out = mlp(x)
    (out * w).sum().backward()
    return [out.detach(), x.grad] + [p.grad for p in mlp.parameters()]


@pytest.mark.parametrize("seqlen,shards", [(12, 3), (13, 4), (10, 1), (3, 5), (16, None)])
def test_tiled_mlp_matches_untiled(seqlen, shards):
    ref = _run(False, seqlen, shards)
    for mine, want in zip(_run(True, seqlen, shards), ref):
        torch.testing.assert_close(mine, want, rtol=1e-12, atol=1e-12)


def test_tiled_mlp_fp32_and_params_from_module_when_not_listed():
    torch.manual_seed(1)
    mlp = _MLP()
    x = torch.randn(1, 11, HIDDEN, requires_grad=True)
    ref = mlp(x)
    ref.square().sum().backward()
    ref_grads = [x.grad.clone()] + [p.grad.clone() for p in mlp.parameters()]
    x.grad = None
    mlp.zero_grad(set_to_none=True)
    out = TiledMLP.apply(_mlp_forward, mlp, x, 4, None)
    out.square().sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    for mine, want in zip([x.grad] + [p.grad for p in mlp.parameters()], ref_grads):
        torch.testing.assert_close(mine, want, rtol=1e-6, atol=1e-6)


def test_tiled_mlp_accumulates_each_parameter_grad_once():
    """ZeRO's reduction hooks fire per .grad accumulation: several shards must still give one."""
    mlp = _MLP()
    fired = {}
    for name, p in mlp.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, n=name: fired.__setitem__(n, fired.get(n, 0) + 1))
    x = torch.randn(1, 20, HIDDEN, requires_grad=True)
    TiledMLP.apply(_mlp_forward, mlp, x, 5, list(mlp.parameters())).sum().backward()
    assert fired == {name: 1 for name, _ in mlp.named_parameters()}


def test_tiled_mlp_keeps_no_shard_activations_between_forward_and_backward():
    mlp = _MLP()
    x = torch.randn(1, 9, HIDDEN, requires_grad=True)
    out = TiledMLP.apply(_mlp_forward, mlp, x, 3, None)
    saved = out.grad_fn.saved_tensors  # only the input: no per-shard activation survives
    assert len(saved) == 1 and saved[0].data_ptr() == x.data_ptr()


def test_shard_count_rule_and_bad_values():
    assert tiled_mlp_num_shards(16, 8) == 2
    assert tiled_mlp_num_shards(17, 8) == 3
    assert tiled_mlp_num_shards(0, 8) == 1
    with pytest.raises(ValueError, match="hidden_size=0"):
        tiled_mlp_num_shards(4, 0)
    with pytest.raises(ValueError, match="got 0"):
        TiledMLP.apply(_mlp_forward, _MLP(), torch.randn(1, 4, HIDDEN), 0, None)


def _max_reduced_shards():
    from deepspeed import comm as dist
    rank = dist.get_rank()
    seqlen = 8 if rank == 0 else 30  # ceil(8/8)=1, ceil(30/8)=4
    return tiled_mlp_num_shards(seqlen, HIDDEN)


def test_shard_count_is_max_reduced_across_ranks(dist_pool):
    assert dist_pool.run(_max_reduced_shards, world_size=2) == [4, 4]
