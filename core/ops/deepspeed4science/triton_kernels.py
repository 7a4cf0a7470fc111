"""Evoformer attention in Triton: the GPU path, also run on CPU by the Triton interpreter
(``TRITON_INTERPRET=1``) in the tests.

Flash-attention style: the forward walks key blocks with an online softmax and writes the output
and the per-query log-sum-exp, never a score matrix; the backward recomputes probability blocks
from the log-sum-exp, one kernel per key block for dK/dV and one per query block for dQ and the
bias gradients. A bias is read through its strides with stride 0 on every broadcast dimension;
its gradient is accumulated with atomic adds into an fp32 buffer of the bias's shape (summed over
the query block first when the bias broadcasts over queries, like ``res_mask``). fp32 dots use
IEEE precision (no TF32), so fp32 results track the torch reference to 1e-5.

Importing this module needs ``triton``.
"""
import torch
import triton
import triton.language as tl

from deepspeed.ops.triton_dot import dot

MAX_HEAD_DIM = 256


@triton.jit
def _base(P, S, b, n, h):
    """``P`` at (batch b, row n, head h) of a ``[B, N, H, L, X]`` view with strides ``S``."""
    return P + b.to(tl.int64) * tl.load(S) + n.to(tl.int64) * tl.load(S + 1) + h.to(tl.int64) * tl.load(S + 2)


@triton.jit
def _tile(P, S, offs_a, offs_b, mask):
    """The ``[len(offs_a), len(offs_b)]`` tile of the last two dimensions, 0 outside ``mask``."""
    ptrs = P + offs_a[:, None] * tl.load(S + 3) + offs_b[None, :] * tl.load(S + 4)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _program(N, H):
    bnh = tl.program_id(1)
    return bnh, bnh // (N * H), (bnh // H) % N, bnh % H


@triton.jit
def _scores(q, k, scale, p1, s1, p2, s2, offs_m, offs_n, valid,
            HAS_B1: tl.constexpr, HAS_B2: tl.constexpr, IEEE: tl.constexpr):
    s = dot(q, tl.trans(k), IEEE) * scale
    if HAS_B1:
        s += _tile(p1, s1, offs_m, offs_n, valid).to(tl.float32)
    if HAS_B2:
        s += _tile(p2, s2, offs_m, offs_n, valid).to(tl.float32)
    return s


@triton.jit
def _probs_and_dscores(q, k, v, do, lse, delta, scale, p1, s1, p2, s2, offs_m, offs_n, valid,
                       HAS_B1: tl.constexpr, HAS_B2: tl.constexpr, IEEE: tl.constexpr):
    """Recomputed probabilities ``p`` and score gradients ``ds = p * (dO V^T - delta)``."""
    s = _scores(q, k, scale, p1, s1, p2, s2, offs_m, offs_n, valid, HAS_B1, HAS_B2, IEEE)
    p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
    return p, p * (dot(do, tl.trans(v), IEEE) - delta[:, None])


@triton.jit
def _fwd(Q, K, V, B1, B2, O, LSE, sq, sk, sv, so, s1, s2, N, H, LQ, LK, D, scale,
         HAS_B1: tl.constexpr, HAS_B2: tl.constexpr, IEEE: tl.constexpr,
         BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    bnh, b, n, h = _program(N, H)
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    rows = offs_m < LQ
    dmask = offs_d < D
    kp, vp = _base(K, sk, b, n, h), _base(V, sv, b, n, h)
    p1, p2 = _base(B1, s1, b, n, h), _base(B2, s2, b, n, h)
    q = _tile(_base(Q, sq, b, n, h), sq, offs_m, offs_d, rows[:, None] & dmask[None, :])
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BD), tl.float32)
    for start in range(0, LK, BN):
        offs_n = start + tl.arange(0, BN)
        cols = offs_n < LK
        k = _tile(kp, sk, offs_n, offs_d, cols[:, None] & dmask[None, :])
        v = _tile(vp, sv, offs_n, offs_d, cols[:, None] & dmask[None, :])
        s = _scores(q, k, scale, p1, s1, p2, s2, offs_m, offs_n, rows[:, None] & cols[None, :],
                    HAS_B1, HAS_B2, IEEE)
        s = tl.where(cols[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, IEEE)
        m_i = m_new
    op = _base(O, so, b, n, h) + offs_m[:, None] * tl.load(so + 3) + offs_d[None, :] * tl.load(so + 4)
    tl.store(op, (acc / l_i[:, None]).to(O.dtype.element_ty), mask=rows[:, None] & dmask[None, :])
    tl.store(LSE + bnh.to(tl.int64) * LQ + offs_m, m_i + tl.log(l_i), mask=rows)


@triton.jit
def _bwd_kv(Q, K, V, B1, B2, DO, LSE, DELTA, DK, DV, sq, sk, sv, s1, s2, sd, N, H, LQ, LK, D,
            scale, HAS_B1: tl.constexpr, HAS_B2: tl.constexpr, IEEE: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    bnh, b, n, h = _program(N, H)
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    cols = offs_n < LK
    dmask = offs_d < D
    kv_mask = cols[:, None] & dmask[None, :]
    k = _tile(_base(K, sk, b, n, h), sk, offs_n, offs_d, kv_mask)
    v = _tile(_base(V, sv, b, n, h), sv, offs_n, offs_d, kv_mask)
    qp, dop = _base(Q, sq, b, n, h), _base(DO, sd, b, n, h)
    p1, p2 = _base(B1, s1, b, n, h), _base(B2, s2, b, n, h)
    dk = tl.zeros((BN, BD), tl.float32)
    dv = tl.zeros((BN, BD), tl.float32)
    for start in range(0, LQ, BM):
        offs_m = start + tl.arange(0, BM)
        rows = offs_m < LQ
        q = _tile(qp, sq, offs_m, offs_d, rows[:, None] & dmask[None, :])
        do = _tile(dop, sd, offs_m, offs_d, rows[:, None] & dmask[None, :])
        lse = tl.load(LSE + bnh.to(tl.int64) * LQ + offs_m, mask=rows, other=0.0)
        delta = tl.load(DELTA + bnh.to(tl.int64) * LQ + offs_m, mask=rows, other=0.0)
        p, ds = _probs_and_dscores(q, k, v, do, lse, delta, scale, p1, s1, p2, s2, offs_m, offs_n,
                                   rows[:, None] & cols[None, :], HAS_B1, HAS_B2, IEEE)
        dv += dot(tl.trans(p).to(do.dtype), do, IEEE)
        dk += dot(tl.trans(ds).to(q.dtype), q, IEEE)
    out = bnh.to(tl.int64) * LK * D + offs_n[:, None] * D + offs_d[None, :]
    tl.store(DK + out, dk * scale, mask=kv_mask)
    tl.store(DV + out, dv, mask=kv_mask)


@triton.jit
def _acc_bias_grad(G, g, b, n, h, ds, offs_m, offs_n, rows, cols):
    base = _base(G, g, b, n, h)
    if tl.load(g + 3) == 0:  # broadcast over queries: one row per block
        tl.atomic_add(base + offs_n * tl.load(g + 4), tl.sum(ds, 0), mask=cols)
    else:
        tl.atomic_add(base + offs_m[:, None] * tl.load(g + 3) + offs_n[None, :] * tl.load(g + 4), ds,
                      mask=rows[:, None] & cols[None, :])


@triton.jit
def _bwd_q(Q, K, V, B1, B2, DO, LSE, DELTA, DQ, G1, G2, sq, sk, sv, s1, s2, sd, g1, g2,
           N, H, LQ, LK, D, scale, HAS_B1: tl.constexpr, HAS_B2: tl.constexpr,
           GRAD_B1: tl.constexpr, GRAD_B2: tl.constexpr, IEEE: tl.constexpr,
           BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    bnh, b, n, h = _program(N, H)
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    rows = offs_m < LQ
    dmask = offs_d < D
    q_mask = rows[:, None] & dmask[None, :]
    q = _tile(_base(Q, sq, b, n, h), sq, offs_m, offs_d, q_mask)
    do = _tile(_base(DO, sd, b, n, h), sd, offs_m, offs_d, q_mask)
    kp, vp = _base(K, sk, b, n, h), _base(V, sv, b, n, h)
    p1, p2 = _base(B1, s1, b, n, h), _base(B2, s2, b, n, h)
    lse = tl.load(LSE + bnh.to(tl.int64) * LQ + offs_m, mask=rows, other=0.0)
    delta = tl.load(DELTA + bnh.to(tl.int64) * LQ + offs_m, mask=rows, other=0.0)
    dq = tl.zeros((BM, BD), tl.float32)
    for start in range(0, LK, BN):
        offs_n = start + tl.arange(0, BN)
        cols = offs_n < LK
        k = _tile(kp, sk, offs_n, offs_d, cols[:, None] & dmask[None, :])
        v = _tile(vp, sv, offs_n, offs_d, cols[:, None] & dmask[None, :])
        p, ds = _probs_and_dscores(q, k, v, do, lse, delta, scale, p1, s1, p2, s2, offs_m, offs_n,
                                   rows[:, None] & cols[None, :], HAS_B1, HAS_B2, IEEE)
        dq += dot(ds.to(k.dtype), k, IEEE)
        if GRAD_B1:
            _acc_bias_grad(G1, g1, b, n, h, ds, offs_m, offs_n, rows, cols)
        if GRAD_B2:
            _acc_bias_grad(G2, g2, b, n, h, ds, offs_m, offs_n, rows, cols)
    out = bnh.to(tl.int64) * LQ * D + offs_m[:, None] * D + offs_d[None, :]
    tl.store(DQ + out, dq * scale, mask=q_mask)


def _strides(t, device):
    """The 5 strides of a ``[B, N, H, L, D]`` view (a bias: ``[B, N, H, Lq, Lk]``) as a device
    tensor, 0 on every dimension of size 1 (broadcast); zeros for a missing tensor."""
    if t is None:
        return torch.zeros(5, dtype=torch.int64, device=device)
    return torch.tensor([0 if size == 1 else stride for size, stride in zip(t.shape, t.stride())],
                        dtype=torch.int64, device=device)


def _blocks(q):
    if q.is_cuda:
        return 64, 64
    return 16, 16  # the interpreter: small tiles keep it quick


def check_supported(q):
    """Why the kernels cannot take ``q`` (``[B, N, H, L, D]``), or None."""
    if q.shape[-1] > MAX_HEAD_DIM:
        return f"head_dim {q.shape[-1]} is above the Triton kernels' limit of {MAX_HEAD_DIM}"
    return None


class TritonEvoformerAttention(torch.autograd.Function):
    """``q, k, v``: ``[B, N, H, L, D]`` views (any strides); biases 5-D broadcastable or None."""

    @staticmethod
    def forward(ctx, q, k, v, bias1, bias2):
        why = check_supported(q)
        if why:
            raise ValueError(f"DS4Sci_EvoformerAttention: {why}")
        batch, rows, heads, lq, dim = q.shape
        lk = k.shape[3]
        out = torch.empty((batch, rows, heads, lq, dim), dtype=q.dtype, device=q.device)
        lse = torch.empty((batch * rows * heads, lq), dtype=torch.float32, device=q.device)
        bm, bn = _blocks(q)
        bd = max(16, triton.next_power_of_2(dim))
        dev = q.device
        dummy = q  # a valid pointer for a missing bias (never read: HAS_B* is False)
        grid = (triton.cdiv(lq, bm), batch * rows * heads)
        _fwd[grid](q, k, v, bias1 if bias1 is not None else dummy, bias2 if bias2 is not None else dummy,
                   out, lse, _strides(q, dev), _strides(k, dev), _strides(v, dev), _strides(out, dev),
                   _strides(bias1, dev), _strides(bias2, dev), rows, heads, lq, lk, dim, dim ** -0.5,
                   HAS_B1=bias1 is not None, HAS_B2=bias2 is not None, IEEE=q.dtype == torch.float32,
                   BM=bm, BN=bn, BD=bd)
        ctx.save_for_backward(q, k, v, out, lse, bias1, bias2)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, bias1, bias2 = ctx.saved_tensors
        batch, rows, heads, lq, dim = q.shape
        lk = k.shape[3]
        dev = q.device
        delta = (dout.float() * out.float()).sum(-1).reshape(batch * rows * heads, lq)
        dq = torch.empty(q.shape, dtype=torch.float32, device=dev)
        dk = torch.empty(k.shape, dtype=torch.float32, device=dev)
        dv = torch.empty(v.shape, dtype=torch.float32, device=dev)
        grads = [torch.zeros(b.shape, dtype=torch.float32, device=dev)
                 if b is not None and ctx.needs_input_grad[3 + i] else None
                 for i, b in enumerate((bias1, bias2))]
        bm, bn = _blocks(q)
        bd = max(16, triton.next_power_of_2(dim))
        common = dict(HAS_B1=bias1 is not None, HAS_B2=bias2 is not None,
                      IEEE=q.dtype == torch.float32, BM=bm, BN=bn, BD=bd)
        b1 = bias1 if bias1 is not None else q
        b2 = bias2 if bias2 is not None else q
        s = [_strides(t, dev) for t in (q, k, v, bias1, bias2, dout)]
        _bwd_kv[(triton.cdiv(lk, bn), batch * rows * heads)](
            q, k, v, b1, b2, dout, lse, delta, dk, dv, *s, rows, heads, lq, lk,
            dim, dim ** -0.5, **common)
        _bwd_q[(triton.cdiv(lq, bm), batch * rows * heads)](
            q, k, v, b1, b2, dout, lse, delta, dq,
            grads[0] if grads[0] is not None else dq, grads[1] if grads[1] is not None else dq,
            *s, _strides(grads[0], dev), _strides(grads[1], dev), rows, heads, lq, lk, dim,
            dim ** -0.5, GRAD_B1=grads[0] is not None, GRAD_B2=grads[1] is not None, **common)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
                *(None if g is None else g.to(b.dtype) for g, b in zip(grads, (bias1, bias2))))
