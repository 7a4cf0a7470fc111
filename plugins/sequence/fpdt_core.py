"""FPDT (Ulysses-Offload) core: chunked causal attention with online-softmax merging.

The sequence is cut into chunks of ``chunk_size`` tokens; query chunk ``i`` attends to
key/value chunks ``0..i`` one at a time, and the partial results are merged with their
log-sum-exp (LSE), so the result is exactly full causal attention while only one
``chunk x chunk`` score block exists at a time. Backward recomputes the score blocks from the
saved LSE (flash-attention style), chunk by chunk as well.

With ``offload=True`` the key/value (and saved query/output) chunks not in use live in the host
pool of a :class:`~deepspeed.sequence.offload.ChunkOffloader` and come back through its double
buffer (the next chunk is copied while the current one is computed on).

A block is computed by torch's fused CPU flash-attention kernel when the tensors are on the CPU
(it returns the block's LSE and has a backward that takes the final output and LSE, which is
exactly what a block of a larger softmax needs), and by plain einsum/softmax elsewhere.

Layout everywhere: ``[batch, seq, heads, head_dim]``; LSE of a block ``[batch, heads, seq]``
(the flash-attention convention), running LSE ``[batch, seq, heads, 1]``. The public modules are
in :mod:`deepspeed.sequence.fpdt_layer`.
"""
import math

import torch
import torch.nn.functional as F

from deepspeed.sequence.offload import ChunkOffloader

__all__ = ["update_out_and_lse", "chunked_causal_attention", "check_fpdt_sizes",
           "shard_sequence"]

_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def update_out_and_lse(out, lse, block_out, block_lse):
    """Merge one block's attention result into the running one (online softmax).

    ``block_out`` ``[b, s, h, d]``, ``block_lse`` ``[b, h, s]``; ``out``/``lse`` the running
    output and ``[b, s, h, 1]`` LSE, or ``None`` for the first block. Returns the new
    ``(out, lse)``, in float32 at least (float64 stays float64)::

        lse_new = log(exp(lse) + exp(block_lse))
        out_new = out * exp(lse - lse_new) + block_out * exp(block_lse - lse_new)

    written with sigmoid / logsigmoid, which stay finite where the plain form overflows.
    """
    dtype = torch.promote_types(block_out.dtype, torch.float32)
    block_out = block_out.to(dtype)
    block_lse = block_lse.to(dtype).transpose(-2, -1).unsqueeze(-1)
    if out is None:
        return block_out, block_lse
    out = out - torch.sigmoid(block_lse - lse) * (out - block_out)
    lse = lse - F.logsigmoid(lse - block_lse)
    return out, lse


def _block(q, k, v, scale, causal):
    """Attention of a query block over a key block: ``(out [b,s,h,d], lse [b,h,s])``. ``causal``
    masks the diagonal block (query and key block start at the same position)."""
    if q.device.type == "cpu" and _CPU_FLASH is not None:
        out, lse = _CPU_FLASH(*(t.transpose(1, 2) for t in (q, k, v)), 0.0, causal, scale=scale)
        return out.transpose(1, 2), lse
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    return torch.einsum("bhqk,bkhd->bqhd", probs, v), lse


def _block_backward(go, q, k, v, out, lse, scale, causal):
    """Gradients ``(dq, dk, dv)`` of one block, given the *final* output ``out`` and ``lse``
    ``[b,h,s]`` of the query chunk: the block's probabilities are ``exp(scores - lse)``."""
    if q.device.type == "cpu" and _CPU_FLASH is not None:
        t = [x.transpose(1, 2) for x in (go, q, k, v, out)]
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            t[0], t[1], t[2], t[3], t[4], lse.contiguous(), 0.0, causal, scale=scale)
        return [g.transpose(1, 2) for g in grads]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    probs = torch.exp(scores - lse.unsqueeze(-1))
    delta = (go * out).sum(-1).transpose(1, 2)  # [b, h, s]: the softmax backward's row term
    dv = torch.einsum("bhqk,bqhd->bkhd", probs, go)
    dprobs = torch.einsum("bqhd,bkhd->bhqk", go, v)
    dscores = probs * (dprobs - delta.unsqueeze(-1)) * scale
    return (torch.einsum("bhqk,bkhd->bqhd", dscores, k), torch.einsum("bhqk,bqhd->bkhd", dscores, q),
            dv)


def check_fpdt_sizes(seqlen, chunk_size, sp_size=1):
    """Clear errors for sizes FPDT cannot run: the (global) sequence must split evenly over the
    sequence-parallel ranks and into chunks of ``chunk_size``."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"FPDT chunk_size must be a positive int, got {chunk_size!r}")
    if seqlen % sp_size != 0:
        raise ValueError(f"sequence length {seqlen} is not divisible by the sequence-parallel "
                         f"size {sp_size}")
    if chunk_size > seqlen:
        raise ValueError(f"FPDT chunk_size {chunk_size} is larger than the sequence length "
                         f"{seqlen}")
    if seqlen % chunk_size != 0:
        raise ValueError(f"sequence length {seqlen} is not divisible by the FPDT chunk_size "
                         f"{chunk_size}")


def shard_sequence(tensor, sp_size, sp_rank, dim=1):
    """This rank's contiguous slice of ``tensor`` along the sequence ``dim``; the length must be
    divisible by ``sp_size``."""
    seqlen = tensor.shape[dim]
    if seqlen % sp_size != 0:
        raise ValueError(f"sequence length {seqlen} is not divisible by the sequence-parallel "
                         f"size {sp_size}")
    return tensor.chunk(sp_size, dim=dim)[sp_rank]


class _ChunkedCausalAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, chunk_size, scale, offload, keep):
        n = q.shape[1] // chunk_size
        pool = ChunkOffloader(offload)
        qs, ks, vs = (t.split(chunk_size, dim=1) for t in (q, k, v))
        k_keys = [pool.store(t) for t in ks]
        v_keys = [pool.store(t) for t in vs]
        outs, lses = [], []
        for i in range(n):
            out = lse = None
            for j, (k_j, v_j) in enumerate(zip(pool.sweep(k_keys[:i + 1], "k"),
                                               pool.sweep(v_keys[:i + 1], "v"))):
                block_out, block_lse = _block(qs[i], k_j, v_j, scale, causal=(i == j))
                out, lse = update_out_and_lse(out, lse, block_out, block_lse)
            outs.append(out.to(q.dtype))
            lses.append(lse.squeeze(-1).transpose(1, 2).contiguous())  # [b, h, c]: no head_dim
        result = torch.cat(outs, dim=1)
        ctx.max_working_bytes = pool.max_working_bytes
        pool.slots.clear()  # the working buffers are not kept between forward and backward
        ctx.pool = pool
        if keep:  # only when a backward will run: the q and out chunks join the host pool
            ctx.keys = (k_keys, v_keys, [pool.store(t) for t in qs], [pool.store(o) for o in outs])
            ctx.n, ctx.scale, ctx.lses = n, scale, lses
        return result

    @staticmethod
    def backward(ctx, grad_out):
        pool, n, scale = ctx.pool, ctx.n, ctx.scale
        k_keys, v_keys, q_keys, out_keys = ctx.keys
        gos = grad_out.split(grad_out.shape[1] // n, dim=1)
        dq = [None] * n
        dk, dv = [], []
        for j, (k_j, v_j) in enumerate(zip(pool.sweep(k_keys, "k"), pool.sweep(v_keys, "v"))):
            dk_j = dv_j = None
            for i, q_i, o_i in zip(range(j, n), pool.sweep(q_keys[j:], "q"),
                                   pool.sweep(out_keys[j:], "out")):
                g = _block_backward(gos[i].to(q_i.dtype), q_i, k_j, v_j, o_i, ctx.lses[i], scale,
                                    causal=(i == j))
                dq[i] = g[0] if dq[i] is None else dq[i] + g[0]
                dk_j = g[1] if dk_j is None else dk_j + g[1]
                dv_j = g[2] if dv_j is None else dv_j + g[2]
            dk.append(dk_j)
            dv.append(dv_j)
        return torch.cat(dq, 1), torch.cat(dk, 1), torch.cat(dv, 1), None, None, None, None


def chunked_causal_attention(q, k, v, chunk_size, softmax_scale=None, offload=False):
    """Causal attention of ``q, k, v`` ``[batch, seq, heads, head_dim]`` computed over chunks of
    ``chunk_size`` tokens with LSE merging; equals full causal softmax attention, forward and
    backward. ``offload`` keeps chunks not in use in the host pool (:class:`ChunkOffloader`)."""
    if q.dim() != 4 or k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"chunked_causal_attention wants q, k, v as [batch, seq, heads, dim] "
                         f"with equal shapes, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    check_fpdt_sizes(q.shape[1], chunk_size)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return _ChunkedCausalAttention.apply(q, k, v, chunk_size, scale, bool(offload), keep)
