"""FPDT core: chunked causal attention with LSE merging equals full causal attention."""
import math

import pytest
import torch
import torch.nn.functional as F

from deepspeed.sequence.fpdt_layer import (ChunkOffloader, FPDTChunkedAttention,
                                           chunked_causal_attention, check_fpdt_sizes,
                                           shard_sequence, update_out_and_lse)

B, S, H, D = 2, 16, 4, 8


def _full_causal(q, k, v):
    """Reference: plain softmax attention, [b, s, h, d] layout."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).triu(1)
    probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


def _inputs(dtype=torch.float64, seed=0, s=S):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, s, H, D, generator=g, dtype=dtype) for _ in range(4)]


def _fwd_bwd(fn, q, k, v, w):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    (out * w).sum().backward()
    return [out.detach()] + [t.grad for t in leaves]


def test_update_out_and_lse_merges_two_halves_exactly():
    q, k, v, _ = _inputs()
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k)

    def part(sl):
        lse = torch.logsumexp(scores[..., sl], -1)
        return torch.einsum("bhqk,bkhd->bqhd", torch.exp(scores[..., sl] - lse[..., None]),
                            v[:, sl]), lse

    out, lse = update_out_and_lse(None, None, *part(slice(0, 5)))
    out, lse = update_out_and_lse(out, lse, *part(slice(5, S)))
    ref = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1).transpose(1, 2)[..., None],
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunk,offload", [(4, False), (4, True), (16, False), (1, True),
                                           (8, True)])
def test_chunked_attention_equals_full_causal_float64(chunk, offload):
    q, k, v, w = _inputs()
    ref = _fwd_bwd(_full_causal, q, k, v, w)
    mine = _fwd_bwd(lambda *t: chunked_causal_attention(*t, chunk, offload=offload), q, k, v, w)
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_chunked_attention_fp32_matches_sdpa():
    q, k, v, w = _inputs(torch.float32, seed=1)
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(  # noqa: E731
        *(t.transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2)
    ref = _fwd_bwd(sdpa, q, k, v, w)
    mine = _fwd_bwd(lambda *t: chunked_causal_attention(*t, 4, offload=True), q, k, v, w)
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_offload_working_buffer_is_bounded_by_the_chunk():
    q, k, v, _ = _inputs(s=64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = chunked_causal_attention(*leaves, 8, offload=True)
    chunk_bytes = B * 8 * H * D * q.element_size()
    # forward: a double buffer (two slots) for k and for v
    assert 0 < out.grad_fn.max_working_bytes <= 4 * chunk_bytes
    out.sum().backward()
    pool = out.grad_fn.pool
    assert pool.max_working_bytes <= 8 * chunk_bytes  # backward: k, v, q, out, two slots each
    assert all(b.shape[1] == 8 for pair in pool.slots.values() for b in pair)
    # the host pool holds copies, not views of the inputs
    assert all(h.data_ptr() != t.data_ptr() for (h, _, _), t in zip(pool.host, leaves))
    # every chunk went to the host once per role, and came back chunk by chunk
    assert pool.bytes_to_host == 4 * (64 // 8) * chunk_bytes


def test_offloader_disabled_returns_the_tensor():
    pool = ChunkOffloader(False)
    t = torch.ones(3)
    assert pool.fetch(pool.store(t), "k") is t


def test_bad_sizes_raise_with_the_values():
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match="chunk_size 32 is larger than the sequence length 16"):
        chunked_causal_attention(q, k, v, 32)
    with pytest.raises(ValueError, match="16 is not divisible by the FPDT chunk_size 5"):
        chunked_causal_attention(q, k, v, 5)
    with pytest.raises(ValueError, match="chunk_size must be a positive int, got 0"):
        check_fpdt_sizes(16, 0)
    with pytest.raises(ValueError, match="sequence length 15 is not divisible by the "
                                         "sequence-parallel size 2"):
        check_fpdt_sizes(15, 5, 2)
    with pytest.raises(ValueError, match="sequence length 15 is not divisible by the "
                                         "sequence-parallel size 2"):
        shard_sequence(torch.zeros(1, 15, 2), 2, 0)
    with pytest.raises(ValueError, match="equal shapes"):
        chunked_causal_attention(q, k[:, :8], v, 4)


def _fpdt_ulysses():
    from deepspeed import comm as dist
    from deepspeed.sequence import parallel_state
    parallel_state.initialize_sequence_parallel(2)
    try:
        rank = dist.get_rank()
        q, k, v, w = _inputs(torch.float32, seed=2)
        ref = _fwd_bwd(_full_causal, q, k, v, w)
        attn = FPDTChunkedAttention(parallel_state.get_sequence_parallel_group(), chunk_size=4,
                                    offload=True)
        mine = [shard_sequence(t, 2, rank).clone().requires_grad_() for t in (q, k, v)]
        out = attn(*mine)
        (out * shard_sequence(w, 2, rank)).sum().backward()
        errors = []
        try:
            FPDTChunkedAttention(parallel_state.get_sequence_parallel_group(), 32)(*mine)
        except ValueError as e:
            errors.append(str(e))
        try:
            FPDTChunkedAttention(parallel_state.get_sequence_parallel_group(), 4)(
                *(t[:, :, :3] for t in mine))
        except ValueError as e:
            errors.append(str(e))
        return ([out.detach()] + [t.grad for t in mine],
                [shard_sequence(t, 2, rank) for t in ref], errors)
    finally:
        parallel_state.destroy_sequence_parallel()


def test_fpdt_with_ulysses_on_two_ranks_equals_dense(dist_pool):
    for mine, ref, errors in dist_pool.run(_fpdt_ulysses, world_size=2):
        for a, b in zip(mine, ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert "chunk_size 32 is larger than the sequence length 16" in errors[0]
        assert "heads 3 are not divisible by the sequence-parallel size 2" in errors[1]
