"""Ulysses attention on sequence slices equals full-sequence attention, forward and backward."""
import torch
import torch.nn.functional as F

from sp_helpers import SP

B, H, S, D = 2, 4, 16, 8


def _inputs(kv_heads=H):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, S, D, generator=g)
    k = torch.randn(B, kv_heads, S, D, generator=g)
    v = torch.randn(B, kv_heads, S, D, generator=g)
    w = torch.randn(B, S, H, D, generator=g)  # weights of the scalar we differentiate
    return q, k, v, w


def _local_sdpa(q, k, v, causal=True):
    """Megatron layout [s, b, h, d] in and out, SDPA math inside."""
    out = F.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)),
                                         is_causal=causal)
    return out.permute(2, 0, 1, 3)


def _distributed_attention():
    from deepspeed import comm as dist
    from deepspeed.sequence import parallel_state
    from deepspeed.sequence.layer import DistributedAttention
    parallel_state.initialize_sequence_parallel(SP)
    try:
        rank, chunk = dist.get_rank(), S // SP
        q, k, v = (t.permute(2, 0, 1, 3) for t in _inputs()[:3])  # [b, h, s, d] -> [s, b, h, d]
        w = _inputs()[3].permute(1, 0, 2, 3)  # [b, s, h, d] -> [s, b, h, d]
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = _local_sdpa(*full)
        (ref * w).sum().backward()
        mine = [t[rank * chunk:(rank + 1) * chunk].clone().requires_grad_() for t in (q, k, v)]
        attn = DistributedAttention(_local_sdpa, parallel_state.get_sequence_parallel_group())
        out = attn(*mine)
        (out * w[rank * chunk:(rank + 1) * chunk]).sum().backward()
        sl = slice(rank * chunk, (rank + 1) * chunk)
        return ([out.detach(), ref.detach()[sl]]
                + [p for m, f in zip(mine, full) for p in (m.grad, f.grad[sl])])
    finally:
        parallel_state.destroy_sequence_parallel()


def test_distributed_attention_matches_full_sequence(dist_pool):
    for result in dist_pool.run(_distributed_attention, world_size=SP):
        for mine, ref in zip(result[::2], result[1::2]):
            torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)


class _Module(torch.nn.Module):
    is_causal = True

    def __init__(self, groups):
        super().__init__()
        self.num_key_value_groups = groups


def _hf_wrapped_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from deepspeed import comm as dist
    from deepspeed.sequence import parallel_state
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    parallel_state.initialize_sequence_parallel(SP)
    try:
        rank, chunk = dist.get_rank(), S // SP
        sl = slice(rank * chunk, (rank + 1) * chunk)
        q, k, v, w = _inputs(kv_heads=2)
        module = _Module(H // 2)
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        ref, _ = sdpa_attention_forward(module, *full, None)
        (ref * w).sum().backward()
        mine = [t[:, :, sl].clone().requires_grad_() for t in (q, k, v)]
        wrapper = UlyssesSPAttentionHF(sdpa_attention_forward, SP, H, 2)
        out, _ = wrapper(module, *mine, None)
        (out * w[:, sl]).sum().backward()
        return ([out.detach(), ref.detach()[:, sl]]
                + [p for m, f in zip(mine, full) for p in (m.grad, f.grad[:, :, sl])])
    finally:
        parallel_state.destroy_sequence_parallel()


def test_hf_wrapped_sdpa_with_grouped_kv_matches_full_sequence(dist_pool):
    for result in dist_pool.run(_hf_wrapped_sdpa, world_size=SP):
        for mine, ref in zip(result[::2], result[1::2]):
            torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)
