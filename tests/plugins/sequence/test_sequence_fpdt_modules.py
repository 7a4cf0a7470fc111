"""The upstream FPDT modules: input layout, Megatron-style attention on 2 Ulysses ranks equal to
dense attention, chunked FFN and logits loss equal to their untiled versions, rotary tables."""
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from deepspeed.sequence.fpdt_layer import (FPDT_Attention, FPDT_FFN, FPDT_InputConstruct,
                                           FPDT_LogitsLoss, apply_rotary_pos_emb,
                                           fpdt_local_indices, rotary_pos_emb)

S, B, HEADS, D, CHUNK = 16, 2, 4, 8, 8
HIDDEN = HEADS * D


def _weights(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"w1": torch.randn(3 * HIDDEN, HIDDEN, generator=g, dtype=dtype) / 4,
            "b1": torch.randn(3 * HIDDEN, generator=g, dtype=dtype) / 4,
            "w2": torch.randn(HIDDEN, HIDDEN, generator=g, dtype=dtype) / 4,
            "b2": torch.randn(HIDDEN, generator=g, dtype=dtype) / 4,
            "x": torch.randn(S, B, HIDDEN, generator=g, dtype=dtype),
            "w": torch.randn(S, B, HIDDEN, generator=g, dtype=dtype)}


def _dense_attention(x, w1, b1, w2, freqs):
    """Reference: Megatron's fused-QKV causal attention on the whole sequence, one process."""
    s, b = x.shape[:2]
    q, k, v = F.linear(x, w1, b1).view(s, b, HEADS, 3 * D).split(D, -1)
    q, k = apply_rotary_pos_emb(q, freqs), apply_rotary_pos_emb(k, freqs)
    scores = torch.einsum("qbhd,kbhd->bhqk", q, k) / math.sqrt(D)
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    ctx = torch.einsum("bhqk,kbhd->qbhd", scores.softmax(-1), v).reshape(s, b, HIDDEN)
    return F.linear(ctx, w2)


def _leaves(t):
    return {k: v.clone().requires_grad_(k != "w") for k, v in t.items()}


def test_input_construct_gives_each_rank_its_slice_of_every_chunk():
    tokens = torch.arange(1, S + 1).expand(B, S)
    expected = {0: [1, 2, 3, 4, 9, 10, 11, 12], 1: [5, 6, 7, 8, 13, 14, 15, 16]}
    for rank in (0, 1):
        ids, labels, mask, attn, pos = FPDT_InputConstruct(
            tokens, tokens + 100, torch.ones(B, S), None, None,
            SimpleNamespace(ds_sequence_parallel_fpdt_chunk_size=CHUNK), 2, rank).generate()
        assert ids[0].tolist() == expected[rank]
        assert (labels - 100).equal(ids) and mask.shape == (B, S // 2) and attn is None
        assert (pos[0] + 1).tolist() == expected[rank]


def test_rotary_matches_transformers_llama():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_rotary
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(S, B, HEADS, D, generator=g, dtype=torch.float64) for _ in range(2))
    freqs = rotary_pos_emb(S, D, theta=500.0)
    cos, sin = freqs.cos()[:, 0, 0][None], freqs.sin()[:, 0, 0][None]  # HF: [1, s, d]
    want_q, want_k = hf_rotary(q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), cos, sin)
    torch.testing.assert_close(apply_rotary_pos_emb(q, freqs), want_q.permute(2, 0, 1, 3))
    torch.testing.assert_close(apply_rotary_pos_emb(k, freqs), want_k.permute(2, 0, 1, 3))
    # rotary_percent 0.5: the second half of each head passes through untouched
    half = apply_rotary_pos_emb(q, rotary_pos_emb(S, D // 2))
    assert half[..., D // 2:].equal(q[..., D // 2:])
    with pytest.raises(ValueError, match="rotary dim 16 is larger than the head dim 8"):
        apply_rotary_pos_emb(q, rotary_pos_emb(S, 16))


def _fpdt_attention_on_two_ranks(offload):
    from deepspeed import comm as dist
    from deepspeed.sequence import parallel_state
    parallel_state.initialize_sequence_parallel(2)
    try:
        rank, group = dist.get_rank(), parallel_state.get_sequence_parallel_group()
        t = _leaves(_weights())
        index = fpdt_local_indices(S, CHUNK, 2, rank)
        x_local = t["x"].detach()[index].clone().requires_grad_()
        config = SimpleNamespace(num_attention_heads=HEADS, hidden_size=HIDDEN)
        attn = FPDT_Attention(config, t["w1"], t["b1"], t["w2"], t["b2"], group,
                              chunk_size=CHUNK, enable_offloading=offload)
        out, bias = attn(x_local, rotary_pos_emb=rotary_pos_emb(S, D // 2, theta=1000.0))
        ((out + bias) * t["w"][index]).sum().backward()
        grads = [t[k].grad for k in ("w1", "b1", "w2", "b2")]
        for g in grads:  # each rank holds the gradient of its own tokens
            dist.all_reduce(g, group=group)
        errors = []
        for bad in (lambda: FPDT_Attention(config, t["w1"], t["b1"], t["w2"], t["b2"], None),
                    lambda: FPDT_Attention(config, t["w1"], t["b1"], t["w2"], t["b2"], group,
                                           chunk_size=32)(x_local),
                    lambda: FPDT_Attention(config, t["w1"], t["b1"], t["w2"], t["b2"], group,
                                           chunk_size=4)(x_local[:3])):
            try:
                bad()
            except ValueError as e:
                errors.append(str(e))
        return index, (out + bias).detach(), x_local.grad, grads, errors
    finally:
        parallel_state.destroy_sequence_parallel()


@pytest.mark.parametrize("offload", [True, False])
def test_fpdt_attention_with_ulysses_equals_dense(dist_pool, offload):
    t = _leaves(_weights())
    ref = _dense_attention(t["x"], t["w1"], t["b1"], t["w2"], rotary_pos_emb(S, D // 2, 1000.0))
    ref = ref + t["b2"]
    (ref * t["w"]).sum().backward()
    for index, out, x_grad, grads, errors in dist_pool.run(_fpdt_attention_on_two_ranks,
                                                           world_size=2, args=(offload,)):
        torch.testing.assert_close(out, ref.detach()[index], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x_grad, t["x"].grad[index], rtol=1e-5, atol=1e-5)
        for mine, name in zip(grads, ("w1", "b1", "w2", "b2")):
            torch.testing.assert_close(mine, t[name].grad, rtol=1e-5, atol=1e-5, msg=name)
        assert "needs a sequence-parallel process group" in errors[0]
        assert "chunk_size 32 is larger than the sequence length 16" in errors[1]
        assert "sequence length 6 is not divisible by the FPDT chunk_size 4" in errors[2]


def test_fpdt_ffn_equals_the_untiled_mlp():
    t = _leaves(_weights(torch.float64))
    w1, b1 = t["w1"][:HIDDEN * 2], t["b1"][:HIDDEN * 2]  # ffn hidden 2 * hidden
    w1 = w1.detach().requires_grad_()
    b1 = b1.detach().requires_grad_()
    w2 = torch.randn(HIDDEN, HIDDEN * 2, dtype=torch.float64, requires_grad=True)
    ref = F.linear(F.gelu(F.linear(t["x"], w1, b1)), w2, t["b2"])
    (ref * t["w"]).sum().backward()
    want = [ref.detach(), t["x"].grad, w1.grad, b1.grad, w2.grad, t["b2"].grad]
    params = [w1, b1, w2, t["b2"], t["x"]]
    for p in params:
        p.grad = None
    out = FPDT_FFN(w1, b1, w2, t["b2"], chunk_size=5)(t["x"])  # uneven: 16 = 5+5+5+1 tokens
    (out * t["w"]).sum().backward()
    for mine, ref in zip([out.detach(), t["x"].grad, w1.grad, b1.grad, w2.grad, t["b2"].grad],
                         want):
        torch.testing.assert_close(mine, ref, rtol=1e-12, atol=1e-12)


def test_fpdt_logits_loss_equals_the_full_logits_loss():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(S, B, HIDDEN, generator=g, dtype=torch.float64, requires_grad=True)
    vocab = torch.randn(50, HIDDEN, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (B, S), generator=g)
    labels[0, :3] = -100
    w = torch.rand(B, S, generator=g, dtype=torch.float64)
    ref = F.cross_entropy(F.linear(x, vocab).permute(1, 2, 0), labels, reduction="none")
    (ref * w).sum().backward()
    want = [ref.detach(), x.grad, vocab.grad]
    x.grad = vocab.grad = None
    loss = FPDT_LogitsLoss(chunk_size=4)(x, labels, vocab)
    (loss * w).sum().backward()
    for mine, ref in zip([loss.detach(), x.grad, vocab.grad], want):
        torch.testing.assert_close(mine, ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"labels \(2, 15\) do not match"):
        FPDT_LogitsLoss(4)(x, labels[:, :15], vocab)
    with pytest.raises(ValueError, match="chunk_size must be a positive int, got 0"):
        FPDT_LogitsLoss(0)


def test_input_construct_rejects_sizes_it_cannot_lay_out():
    tokens = torch.zeros(1, S, dtype=torch.long)
    with pytest.raises(ValueError, match="chunk_size 6 is not divisible by the sequence-parallel"
                                         " size 4"):
        fpdt_local_indices(24, 6, 4, 0)
    with pytest.raises(ValueError, match="chunk_size 32 is larger than the sequence length 16"):
        FPDT_InputConstruct(tokens, None, None, None, None, 32, 2, 0)
    with pytest.raises(ValueError, match="sequence length 15 is not divisible by the "
                                         "sequence-parallel size 2"):
        FPDT_InputConstruct(tokens[:, :15], None, None, None, None, 5, 2, 0)
    with pytest.raises(ValueError, match="ds_sequence_parallel_fpdt_chunk_size"):
        FPDT_InputConstruct(tokens, None, None, None, None, object(), 2, 0)
