"""FPDT (Ulysses-Offload) core: chunked causal attention with online-softmax merging.

``deepspeed.sequence.fpdt_layer``. The sequence is cut into chunks of ``chunk_size`` tokens;
query chunk ``i`` attends to key/value chunks ``0..i`` one at a time, and the partial results
are merged with their log-sum-exp (LSE), so the result is exactly full causal attention while
only one ``chunk x chunk`` score block exists at a time. Backward recomputes the score blocks
from the saved LSE (flash-attention style), chunk by chunk as well.

With ``offload=True`` the key/value (and saved query/output) chunks not in use live in a host
pool and are copied into a working buffer of one chunk per role (k, v, q, out) when needed
(no asynchronous prefetch/double buffering yet); on CPU "host" and "device" are the same memory, so this is a plain copy, but the code
path (and the bound on the working buffer) is the same.

Layout everywhere: ``[batch, seq, heads, head_dim]``; LSE of a block ``[batch, heads, seq]``
(the flash-attention convention), running LSE ``[batch, seq, heads, 1]``.

Not here (yet): the Megatron-specific upstream modules ``FPDT_InputConstruct``,
``FPDT_Attention(config, qkv weights, ...)``, ``FPDT_FFN`` and ``FPDT_LogitsLoss``.
:class:`FPDTChunkedAttention` composes the chunked kernel with the Ulysses all-to-all instead.
"""
import math

import torch
import torch.nn.functional as F

from deepspeed import comm as dist
from deepspeed.sequence.all_to_all import seq_all_to_all

__all__ = ["update_out_and_lse", "chunked_causal_attention", "FPDTChunkedAttention",
           "ChunkOffloader", "check_fpdt_sizes", "shard_sequence"]


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
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    return torch.einsum("bhqk,bkhd->bqhd", probs, v), lse


class ChunkOffloader:
    """Host pool for chunks not in use and a working buffer of one chunk per role.

    ``store(t)`` keeps a host copy (pinned when the tensor is on an accelerator) and returns its
    key; ``fetch(key, role)`` copies it into the working slot of ``role`` ("k", "v", "q", "out")
    and returns that slot, so the working buffer holds at most one chunk per role, whatever the
    sequence length: ``max_working_bytes`` records its size. With ``enabled=False`` chunks are
    kept as they are and ``fetch`` returns them.
    """

    def __init__(self, enabled):
        self.enabled = enabled
        self.host = []
        self.slots = {}  # role -> one chunk-sized tensor
        self.max_working_bytes = 0

    def store(self, tensor):
        if self.enabled:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu",
                               pin_memory=tensor.is_cuda)
            host.copy_(tensor)
            self.host.append((host, tensor.device))
        else:
            self.host.append((tensor, tensor.device))
        return len(self.host) - 1

    def fetch(self, key, role):
        host, device = self.host[key]
        if not self.enabled:
            return host
        buf = self.slots.get(role)
        if buf is None or buf.shape != host.shape or buf.dtype != host.dtype:
            buf = self.slots[role] = torch.empty(host.shape, dtype=host.dtype, device=device)
            self.max_working_bytes = max(self.max_working_bytes, sum(
                b.numel() * b.element_size() for b in self.slots.values()))
        buf.copy_(host, non_blocking=host.is_pinned())
        return buf


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
    def forward(ctx, q, k, v, chunk_size, scale, offload):
        n = q.shape[1] // chunk_size
        pool = ChunkOffloader(offload)
        qs, ks, vs = (t.split(chunk_size, dim=1) for t in (q, k, v))
        keys = [(pool.store(qs[i]), pool.store(ks[i]), pool.store(vs[i])) for i in range(n)]
        outs, lses = [], []
        for i in range(n):
            q_i = qs[i]
            out = lse = None
            for j in range(i + 1):
                k_j = pool.fetch(keys[j][1], "k")
                v_j = pool.fetch(keys[j][2], "v")
                block_out, block_lse = _block(q_i, k_j, v_j, scale, causal=(i == j))
                out, lse = update_out_and_lse(out, lse, block_out, block_lse)
            outs.append(out.to(q.dtype))
            lses.append(lse)
        out = torch.cat(outs, dim=1)
        ctx.pool, ctx.keys, ctx.n, ctx.chunk, ctx.scale = pool, keys, n, chunk_size, scale
        ctx.out_keys = [pool.store(o) for o in outs]
        ctx.lses = lses  # [b, c, h, 1] per chunk: small (no head_dim)
        ctx.max_working_bytes = pool.max_working_bytes
        return out

    @staticmethod
    def backward(ctx, grad_out):
        pool, keys, n, c, scale = ctx.pool, ctx.keys, ctx.n, ctx.chunk, ctx.scale
        gos = grad_out.split(c, dim=1)
        dq = [None] * n
        dk, dv = [], []
        # D_i = rowsum(dO_i * O_i): the softmax backward's correction term, [b, h, c]
        deltas = []
        for i in range(n):
            o_i = pool.fetch(ctx.out_keys[i], "out")
            deltas.append((gos[i].to(o_i.dtype) * o_i).sum(-1).transpose(1, 2))
        for j in range(n):
            k_j = pool.fetch(keys[j][1], "k")
            v_j = pool.fetch(keys[j][2], "v")
            dk_j = torch.zeros_like(k_j)
            dv_j = torch.zeros_like(v_j)
            for i in range(j, n):
                q_i = pool.fetch(keys[i][0], "q")
                lse_i = ctx.lses[i].squeeze(-1).transpose(1, 2).to(q_i.dtype)  # [b, h, c]
                scores = torch.einsum("bqhd,bkhd->bhqk", q_i, k_j) * scale
                if i == j:
                    mask = torch.ones(c, c, dtype=torch.bool, device=q_i.device).triu(1)
                    scores = scores.masked_fill(mask, float("-inf"))
                probs = torch.exp(scores - lse_i.unsqueeze(-1))
                go_i = gos[i].to(q_i.dtype)
                dv_j += torch.einsum("bhqk,bqhd->bkhd", probs, go_i)
                dprobs = torch.einsum("bqhd,bkhd->bhqk", go_i, v_j)
                dscores = probs * (dprobs - deltas[i].unsqueeze(-1)) * scale
                dq_i = torch.einsum("bhqk,bkhd->bqhd", dscores, k_j)
                dq[i] = dq_i if dq[i] is None else dq[i] + dq_i
                dk_j += torch.einsum("bhqk,bqhd->bkhd", dscores, q_i)
            dk.append(dk_j)
            dv.append(dv_j)
        return torch.cat(dq, 1), torch.cat(dk, 1), torch.cat(dv, 1), None, None, None


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
    return _ChunkedCausalAttention.apply(q, k, v, chunk_size, scale, bool(offload))


class FPDTChunkedAttention(torch.nn.Module):
    """Ulysses all-to-all + chunked causal attention: each rank holds ``[batch, seq/sp, heads,
    dim]`` slices of q, k, v; one all-to-all gives ``[batch, seq, heads/sp, dim]``, the chunked
    attention runs over the whole sequence, and the inverse all-to-all restores the slice
    layout. ``chunk_size`` counts tokens of the whole sequence."""

    def __init__(self, sequence_process_group, chunk_size, offload=False, softmax_scale=None):
        super().__init__()
        if sequence_process_group is None:
            raise ValueError("FPDTChunkedAttention needs a sequence-parallel process group, got "
                             "None")
        self.spg, self.chunk_size = sequence_process_group, chunk_size
        self.offload, self.softmax_scale = offload, softmax_scale

    def forward(self, query, key, value):
        sp = dist.get_world_size(group=self.spg)
        heads = query.shape[2]
        if heads % sp != 0:
            raise ValueError(f"FPDT attention heads {heads} are not divisible by the "
                             f"sequence-parallel size {sp}")
        check_fpdt_sizes(query.shape[1] * sp, self.chunk_size, sp)
        q, k, v = (seq_all_to_all(t, self.spg, 2, 1) for t in (query, key, value))
        out = chunked_causal_attention(q, k, v, self.chunk_size, self.softmax_scale, self.offload)
        return seq_all_to_all(out, self.spg, 1, 2)
