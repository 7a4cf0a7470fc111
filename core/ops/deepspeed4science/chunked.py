"""Evoformer attention in torch ops, chunked so that no full attention matrix exists.

The naive form materialises ``softmax(Q K^T / sqrt(D) + biases)`` for every (batch, row, head):
``[B, N, H, Lq, Lk]`` floats, kept for backward too, which is what makes Evoformer's memory
explode. Here the forward walks (row, query) chunks whose score block stays under a fixed
element budget and keeps only the output and the per-query log-sum-exp; the backward
(``torch.autograd.Function``) walks the same chunks, recomputes each probability block from the
log-sum-exp and accumulates dQ, dK, dV and the bias gradients, reduced over the dimensions each
bias broadcasts over. Chunks compute in fp32 whatever the input dtype, so the chunk size does not
change the result beyond rounding.
"""
import os

import torch

CHUNK_ENV = "DS_EVOFORMER_CHUNK_ELEMENTS"
DEFAULT_CHUNK_ELEMENTS = 1 << 20  # 4 MiB of fp32 scores per chunk


def chunk_plan(batch, rows, heads, lq, lk, budget=None):
    """(rows per chunk, queries per chunk) keeping a score block near ``budget`` elements."""
    budget = budget or int(os.environ.get(CHUNK_ENV, DEFAULT_CHUNK_ELEMENTS))
    per_query = batch * heads * lk
    q_chunk = max(1, min(lq, budget // per_query))
    n_chunk = max(1, min(rows, budget // (per_query * q_chunk))) if q_chunk == lq else 1
    return n_chunk, q_chunk


def _sliced(bias, n_sl, q_sl):
    """The part of a broadcastable 5-D bias that a (rows, queries) chunk sees."""
    return bias[:, n_sl if bias.shape[1] > 1 else slice(None), :,
                q_sl if bias.shape[3] > 1 else slice(None)]


def _blocks(rows, lq, n_chunk, q_chunk):
    for n0 in range(0, rows, n_chunk):
        for q0 in range(0, lq, q_chunk):
            yield slice(n0, n0 + n_chunk), slice(q0, q0 + q_chunk)


def _scores(q, k, biases, n_sl, q_sl, scale):
    """Scaled scores plus biases of one chunk, fp32: the scale goes on the (small) query block and
    the biases into the matmul's accumulator (``baddbmm``), so the score block is written once."""
    qc = q[:, n_sl, :, q_sl].float() * scale
    kc = k[:, n_sl].float()
    shape = qc.shape[:-1] + (kc.shape[-2],)
    present = [_sliced(b, n_sl, q_sl).float() for b in biases if b is not None]
    if not present:
        return qc @ kc.transpose(-1, -2)
    bias = present[0] if len(present) == 1 else present[0] + present[1]
    bias = bias.expand(shape).reshape(-1, shape[-2], shape[-1])
    s = torch.baddbmm(bias, qc.reshape(-1, *qc.shape[-2:]), kc.reshape(-1, *kc.shape[-2:]).transpose(-1, -2))
    return s.view(shape)


class ChunkedEvoformerAttention(torch.autograd.Function):
    """``q, k, v``: ``[B, N, H, L, D]`` (head-major views); biases: 5-D broadcastable or None."""

    @staticmethod
    def forward(ctx, q, k, v, bias1, bias2, budget):
        batch, rows, heads, lq, dim = q.shape
        plan = chunk_plan(batch, rows, heads, lq, k.shape[3], budget)
        scale = dim ** -0.5
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        for n_sl, q_sl in _blocks(rows, lq, *plan):
            s = _scores(q, k, (bias1, bias2), n_sl, q_sl, scale)
            m = s.amax(dim=-1, keepdim=True)
            p = s.sub_(m).exp_()  # in place: the score block is the only big temporary
            total = p.sum(-1, keepdim=True)
            out[:, n_sl, :, q_sl] = ((p @ v[:, n_sl].float()) / total).to(q.dtype)
            lse[:, n_sl, :, q_sl] = (m + total.log()).squeeze(-1)
        ctx.plan, ctx.scale = plan, scale
        ctx.save_for_backward(q, k, v, out, lse, bias1, bias2)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, bias1, bias2 = ctx.saved_tensors
        rows, lq = q.shape[1], q.shape[3]
        f32 = dict(dtype=torch.float32, device=q.device)
        dq, dk, dv = torch.zeros(q.shape, **f32), torch.zeros(k.shape, **f32), torch.zeros(v.shape, **f32)
        biases = (bias1, bias2)
        dbias = [torch.zeros(b.shape, **f32) if b is not None and ctx.needs_input_grad[3 + i] else None
                 for i, b in enumerate(biases)]
        delta = (dout.float() * out.float()).sum(-1)  # [B, N, H, Lq]
        for n_sl, q_sl in _blocks(rows, lq, *ctx.plan):
            p = _scores(q, k, biases, n_sl, q_sl, ctx.scale).sub_(lse[:, n_sl, :, q_sl, None]).exp_()
            do = dout[:, n_sl, :, q_sl].float()
            dv[:, n_sl] += p.transpose(-1, -2) @ do
            ds = (do @ v[:, n_sl].float().transpose(-1, -2)).sub_(delta[:, n_sl, :, q_sl, None]).mul_(p)
            dq[:, n_sl, :, q_sl] = (ds @ k[:, n_sl].float()) * ctx.scale
            dk[:, n_sl] += (ds.transpose(-1, -2) @ q[:, n_sl, :, q_sl].float()) * ctx.scale
            for grad in dbias:
                if grad is not None:
                    dims = [d for d in range(5) if grad.shape[d] == 1 and ds.shape[d] > 1]
                    _sliced(grad, n_sl, q_sl).add_(ds.sum(dims, keepdim=True) if dims else ds)
        grads = [dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)]
        grads += [None if g is None else g.to(b.dtype) for g, b in zip(dbias, biases)]
        return (*grads, None)
