"""SparseSelfAttention equals dense attention: plain softmax attention for the dense pattern,
attention under the token mask expanded from the layout for Fixed and BigBird."""
import pytest
import torch
import torch.nn.functional as F

from reference import token_mask

from deepspeed.sparse_attention import (BigBirdSparsityConfig, DenseSparsityConfig,
                                        FixedSparsityConfig, SparseSelfAttention)


def _qkv(z, h, s, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(z, h, s, d, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


def _dense(q, k, v, mask=None, key_add=None):
    scores = q @ k.mT / q.shape[-1] ** 0.5
    if key_add is not None:
        scores = scores + key_add[:, None, None, :]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def test_dense_pattern_equals_sdpa():
    q, k, v = _qkv(2, 4, 64, 16)
    out = SparseSelfAttention(DenseSparsityConfig(4, block=16), max_seq_length=128)(q, k, v)
    want = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, (q, k, v), g),
                               torch.autograd.grad(want, (q, k, v), g), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cfg", [
    FixedSparsityConfig(4, block=16, num_local_blocks=2),
    FixedSparsityConfig(4, block=16, different_layout_per_head=True, num_local_blocks=4,
                        num_different_global_patterns=4, attention="unidirectional"),
    BigBirdSparsityConfig(4, block=16, different_layout_per_head=True, num_random_blocks=1, seed=1),
], ids=["fixed", "fixed-causal-per-head", "bigbird"])
@pytest.mark.parametrize("mode", ["add", "mul"])
def test_pattern_equals_masked_dense(cfg, mode):
    q, k, v = _qkv(2, 4, 128, 16, seed=2)
    keep = torch.ones(2, 128)
    keep[1, 100:] = 0  # the second sequence is padded
    kp = keep if mode == "mul" else torch.zeros(2, 128).masked_fill(keep == 0, -1e4)
    attn = SparseSelfAttention(cfg, key_padding_mask_mode=mode, max_seq_length=256)
    out = attn(q, k, v, key_padding_mask=kp[:, None, None, :])  # BERT's extended shape
    mask = token_mask(attn.get_layout(128), 16)
    if mode == "add":
        want = _dense(q, k, v, mask, kp)
    else:
        want = _dense(q, k, v, mask & keep.bool()[:, None, None, :])
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, (q, k, v), g),
                               torch.autograd.grad(want, (q, k, v), g), atol=1e-5, rtol=1e-5)


def test_attn_mask_and_rpe():
    cfg = FixedSparsityConfig(2, block=16, num_local_blocks=2)
    q, k, v = _qkv(1, 2, 64, 8, seed=3)
    rpe = torch.randn(2, 64, 64)
    causal = torch.ones(64, 64).tril()
    out = SparseSelfAttention(cfg, attn_mask_mode="mul", max_seq_length=64)(q, k, v, rpe=rpe, attn_mask=causal)
    layout_mask = token_mask(cfg.make_layout(64), 16)
    scores = q @ k.mT / 8 ** 0.5 + rpe
    scores = scores.masked_fill(~(layout_mask & causal.bool()), float("-inf"))
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, atol=1e-5, rtol=1e-5)


def test_gradcheck_double():
    cfg = FixedSparsityConfig(2, block=16, num_local_blocks=2)
    attn = SparseSelfAttention(cfg, max_seq_length=64)
    q, k, v = _qkv(1, 2, 64, 4, dtype=torch.float64, seed=4)
    assert torch.autograd.gradcheck(lambda q, k, v: attn(q, k, v), (q, k, v), eps=1e-6, atol=1e-5,
                                    fast_mode=True)


def test_bf16_runs_and_tracks_fp32():
    cfg = FixedSparsityConfig(2, block=16, num_local_blocks=2)
    q, k, v = _qkv(1, 2, 64, 16, seed=5)
    attn = SparseSelfAttention(cfg, max_seq_length=64)
    out = attn(*(t.detach().bfloat16() for t in (q, k, v)))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), attn(q, k, v), atol=3e-2, rtol=3e-2)


def test_bad_inputs():
    attn = SparseSelfAttention(FixedSparsityConfig(4, block=16), max_seq_length=128)
    q, k, v = _qkv(1, 4, 72, 8)
    with pytest.raises(ValueError, match="72, needs to be dividable by Block size 16.*pad_to_block_size"):
        attn(q, k, v)
    q, k, v = _qkv(1, 2, 64, 8)
    with pytest.raises(ValueError, match="2 attention heads but the sparsity config was made for num_heads=4"):
        attn(q, k, v)
    q, k, v = _qkv(1, 4, 256, 8)
    with pytest.raises(ValueError, match="longer than this module's max_seq_length 128"):
        attn(q, k, v)
    with pytest.raises(NotImplementedError, match="allowed: add, mul"):
        SparseSelfAttention(FixedSparsityConfig(4), attn_mask_mode="xor")
    with pytest.raises(NotImplementedError, match="only self-attention"):
        attn(*_qkv(1, 4, 64, 8)[:2], torch.randn(1, 4, 32, 8))
