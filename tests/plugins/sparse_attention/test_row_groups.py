"""The fused row-group CPU path (``row_groups.py``, what ``SparseSelfAttention`` runs on CPU)
against masked dense attention and against the blocked path (``backend="blocked"``): forward
and backward, with every mask kind, fully masked rows, per-head layouts and fp64 gradcheck."""
import pytest
import torch

from reference import token_mask

from deepspeed.sparse_attention import (BigBirdSparsityConfig, BSLongformerSparsityConfig,
                                        DenseSparsityConfig, FixedSparsityConfig,
                                        SparseSelfAttention, VariableSparsityConfig, row_groups)
from deepspeed.sparse_attention.layout_index import BlockLayout

S = 128


def _qkv(z, h, s, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(z, h, s, d, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


def _reference(q, k, v, layout, add=None):
    """Dense softmax attention restricted to the layout, ``add`` an additive [Z|1, H|1, S, S]
    mask; rows with nothing left give zeros."""
    scores = q @ k.mT / q.shape[-1] ** 0.5
    if add is not None:
        scores = scores + add
    keep = token_mask(layout, 16)[None] & ~torch.isneginf(scores)
    scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0)
    return probs @ v


def _grads(out, inputs, seed=9):
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, inputs, g)


CONFIGS = {
    "fixed": lambda: FixedSparsityConfig(4, block=16, num_local_blocks=4, num_global_blocks=1),
    "fixed-causal": lambda: FixedSparsityConfig(4, block=16, num_local_blocks=2,
                                                attention="unidirectional"),
    "fixed-per-head": lambda: FixedSparsityConfig(4, block=16, different_layout_per_head=True,
                                                  num_local_blocks=4, num_different_global_patterns=2),
    "bigbird-per-head": lambda: BigBirdSparsityConfig(4, block=16, different_layout_per_head=True,
                                                      num_random_blocks=1, seed=3),
    "longformer": lambda: BSLongformerSparsityConfig(4, block=16),
    "variable": lambda: VariableSparsityConfig(4, block=16),
    "dense": lambda: DenseSparsityConfig(4, block=16),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_backward_equal_masked_dense_and_blocked(name):
    cfg = CONFIGS[name]()
    fast = SparseSelfAttention(cfg, max_seq_length=S)
    layout = fast.get_layout(S)
    blocked = SparseSelfAttention(cfg, max_seq_length=S, backend="blocked")
    blocked.master_layout.copy_(fast.master_layout)  # random patterns: the same blocks
    q, k, v = _qkv(2, 4, S, 16, seed=1)
    out = fast(q, k, v)
    want = _reference(q, k, v, layout)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, blocked(q, k, v), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_grads(out, (q, k, v)), _grads(want, (q, k, v)), atol=1e-5, rtol=1e-5)


def test_plan_of_fixed_is_one_shared_call_and_one_window_stack():
    cfg = FixedSparsityConfig(4, block=16, num_local_blocks=4, num_global_blocks=1)
    layout = BlockLayout(cfg.make_layout(512), 16)
    (hc,) = row_groups.plan(layout)                      # all heads alike: one head class
    assert hc.contiguous == (0, 4)
    assert hc.shared.tolist() == list(range(3, 32, 4))   # the global columns
    (stack,) = hc.stacks                                 # every window: 4 rows, 3 local blocks
    assert tuple(stack.rows.shape) == (8, 4) and tuple(stack.cols.shape) == (8, 3)
    assert row_groups.plan(layout) is row_groups.plan(layout)  # cached on the layout


@pytest.mark.parametrize("kp_mode", ["add", "mul"])
def test_all_masks_forward_backward(kp_mode):
    cfg = FixedSparsityConfig(4, block=16, different_layout_per_head=True, num_local_blocks=2,
                              num_different_global_patterns=2)
    attn = SparseSelfAttention(cfg, key_padding_mask_mode=kp_mode, attn_mask_mode="mul",
                               max_seq_length=S)
    q, k, v = _qkv(2, 4, S, 16, seed=2)
    keep = torch.ones(2, S)
    keep[1, 90:] = 0
    kp = keep if kp_mode == "mul" else torch.zeros(2, S).masked_fill(keep == 0, -1e4)
    causal = torch.ones(S, S).tril()
    rpe = torch.randn(4, S, S, generator=torch.Generator().manual_seed(7))
    out = attn(q, k, v, rpe=rpe, key_padding_mask=kp[:, None, None, :], attn_mask=causal)
    add = rpe[None] + causal.log()[None, None]
    add = add + (keep.log() if kp_mode == "mul" else kp)[:, None, None, :]
    want = _reference(q, k, v, attn.get_layout(S), add)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_grads(out, (q, k, v)), _grads(want, (q, k, v)), atol=1e-5, rtol=1e-5)


def test_rpe_2d_equals_blocked():
    cfg = FixedSparsityConfig(2, block=16, num_local_blocks=2)
    q, k, v = _qkv(1, 2, 64, 8, seed=3)
    rpe = torch.randn(64, 64)
    out = SparseSelfAttention(cfg, max_seq_length=64)(q, k, v, rpe=rpe)
    want = SparseSelfAttention(cfg, max_seq_length=64, backend="blocked")(q, k, v, rpe=rpe)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_fully_masked_rows_give_zeros_and_finite_grads():
    cfg = FixedSparsityConfig(2, block=16, num_local_blocks=2)
    attn = SparseSelfAttention(cfg, attn_mask_mode="mul", max_seq_length=64)
    q, k, v = _qkv(1, 2, 64, 8, seed=4)
    mask = torch.ones(64, 64)
    mask[5] = 0                                           # query 5 sees nothing
    out = attn(q, k, v, attn_mask=mask)
    assert torch.equal(out[:, :, 5], torch.zeros_like(out[:, :, 5]))
    want = SparseSelfAttention(cfg, attn_mask_mode="mul", max_seq_length=64, backend="blocked")(
        q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    grads = _grads(out, (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    torch.testing.assert_close(grads, _grads(want, (q, k, v)), atol=1e-5, rtol=1e-5)


def test_gradcheck_double_with_masks():
    cfg = FixedSparsityConfig(2, block=16, different_layout_per_head=True, num_local_blocks=2,
                              num_different_global_patterns=2)
    attn = SparseSelfAttention(cfg, max_seq_length=64)
    q, k, v = _qkv(1, 2, 64, 4, dtype=torch.float64, seed=5)
    kp = torch.zeros(1, 64, dtype=torch.float64)
    kp[0, 50:] = -1e4
    rpe = torch.randn(2, 64, 64, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda q, k, v: attn(q, k, v, rpe=rpe, key_padding_mask=kp),
                                    (q, k, v), eps=1e-6, atol=1e-5, fast_mode=True)


def test_blocked_backend_still_runs_the_ops():
    cfg = FixedSparsityConfig(2, block=16, num_local_blocks=2)
    attn = SparseSelfAttention(cfg, max_seq_length=64, backend="blocked")
    q, k, v = _qkv(1, 2, 64, 8, seed=6)
    attn(q, k, v)
    assert (2, 64) in attn._ops                           # went through sdd / softmax / dsd


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch's flash kernel)")
@pytest.mark.parametrize("name", ["fixed", "fixed-causal", "fixed-per-head", "bigbird-per-head"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_row_groups_on_the_cuda_flash_kernel_equal_masked_dense(name, dtype):
    """``backend="torch"`` on a GPU: the same plan on torch's CUDA flash kernel, forward and
    backward, against masked dense attention computed in fp32 from the same inputs."""
    cfg = CONFIGS[name]()
    attn = SparseSelfAttention(cfg, max_seq_length=S, backend="torch")
    q, k, v = (t.detach().to("cuda", dtype).requires_grad_() for t in _qkv(2, 4, S, 64, seed=1))
    assert row_groups.cuda_eligible(q, masked=False) and attn._runs_row_groups(q, False)
    out = attn(q, k, v)
    layout = attn.get_layout(S).cpu()
    ref_inputs = [t.detach().float().cpu().requires_grad_() for t in (q, k, v)]
    ref = _reference(*ref_inputs, layout)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=4e-3, rtol=4e-3)
    torch.testing.assert_close(out.float().cpu(), ref, **tol)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    got = torch.autograd.grad(out, (q, k, v), g.to("cuda", dtype))
    want = torch.autograd.grad(ref, ref_inputs, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float().cpu(), b, **tol)


def test_token_indices_are_made_once_per_plan_and_device(monkeypatch):
    """On a GPU every fresh index tensor is a host-to-device copy the stream waits for (the
    H200 bench spent ~1.2 ms per 4K call on them): a second call, forward and backward, makes
    none, and computes the same."""
    cfg = FixedSparsityConfig(4, block=16, num_local_blocks=4, num_global_blocks=1)
    attn = SparseSelfAttention(cfg, max_seq_length=S)
    made = []
    original = row_groups._tokens
    monkeypatch.setattr(row_groups, "_tokens", lambda *a: made.append(1) or original(*a))
    results = []
    for _ in range(2):
        q, k, v = _qkv(1, 4, S, 16, seed=2)
        out = attn(q, k, v)
        results.append((out.detach(), _grads(out, (q, k, v))))
        made.append("call")
    first = made.index("call")
    assert first > 0 and made[first + 1:] == ["call"]
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
