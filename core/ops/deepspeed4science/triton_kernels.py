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

MAX_HEAD_DIM = 256


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _tile(P, sm, sn, offs_m, offs_n, mask):
    return tl.load(P + offs_m[:, None] * sm + offs_n[None, :] * sn, mask=mask, other=0.0)


@triton.jit
def _bias_ptr(B, sb, b, sn, n, sh, h):
    return B + b.to(tl.int64) * sb + n.to(tl.int64) * sn + h.to(tl.int64) * sh


@triton.jit
def _scores(q, k, scale, B1, B2, p1, p2, offs_m, offs_n, valid, s1m, s1k, s2m, s2k,
            HAS_B1: tl.constexpr, HAS_B2: tl.constexpr, IEEE: tl.constexpr):
    s = _dot(q, tl.trans(k), IEEE) * scale
    if HAS_B1:
        s += _tile(p1, s1m, s1k, offs_m, offs_n, valid).to(tl.float32)
    if HAS_B2:
        s += _tile(p2, s2m, s2k, offs_m, offs_n, valid).to(tl.float32)
    return s


@triton.jit
def _fwd(Q, K, V, B1, B2, O, LSE, sq, sk, sv, so, s1, s2, N, H, LQ, LK, D, scale,
         HAS_B1: tl.constexpr, HAS_B2: tl.constexpr, IEEE: tl.constexpr,
         BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    pid_m = tl.program_id(0)
    bnh = tl.program_id(1)
    b = bnh // (N * H)
    n = (bnh // H) % N
    h = bnh % H
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    rows = offs_m < LQ
    dmask = offs_d < D
    qp = _bias_ptr(Q, tl.load(sq), b, tl.load(sq + 1), n, tl.load(sq + 2), h)
    kp = _bias_ptr(K, tl.load(sk), b, tl.load(sk + 1), n, tl.load(sk + 2), h)
    vp = _bias_ptr(V, tl.load(sv), b, tl.load(sv + 1), n, tl.load(sv + 2), h)
    p1 = _bias_ptr(B1, tl.load(s1), b, tl.load(s1 + 1), n, tl.load(s1 + 2), h)
    p2 = _bias_ptr(B2, tl.load(s2), b, tl.load(s2 + 1), n, tl.load(s2 + 2), h)
    q = _tile(qp, tl.load(sq + 3), tl.load(sq + 4), offs_m, offs_d, rows[:, None] & dmask[None, :])
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BD), tl.float32)
    for start in range(0, LK, BN):
        offs_n = start + tl.arange(0, BN)
        cols = offs_n < LK
        kv_mask = cols[:, None] & dmask[None, :]
        k = _tile(kp, tl.load(sk + 3), tl.load(sk + 4), offs_n, offs_d, kv_mask)
        v = _tile(vp, tl.load(sv + 3), tl.load(sv + 4), offs_n, offs_d, kv_mask)
        s = _scores(q, k, scale, B1, B2, p1, p2, offs_m, offs_n, rows[:, None] & cols[None, :],
                    tl.load(s1 + 3), tl.load(s1 + 4), tl.load(s2 + 3), tl.load(s2 + 4),
                    HAS_B1, HAS_B2, IEEE)
        s = tl.where(cols[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
        m_i = m_new
    acc = acc / l_i[:, None]
    op = _bias_ptr(O, tl.load(so), b, tl.load(so + 1), n, tl.load(so + 2), h)
    tl.store(op + offs_m[:, None] * tl.load(so + 3) + offs_d[None, :] * tl.load(so + 4),
             acc.to(O.dtype.element_ty), mask=rows[:, None] & dmask[None, :])
    tl.store(LSE + bnh.to(tl.int64) * LQ + offs_m, m_i + tl.log(l_i), mask=rows)


@triton.jit
def _bwd_kv(Q, K, V, B1, B2, DO, LSE, DELTA, DK, DV, sq, sk, sv, s1, s2, sd, sdk, N, H, LQ, LK, D,
            scale, HAS_B1: tl.constexpr, HAS_B2: tl.constexpr, IEEE: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    pid_n = tl.program_id(0)
    bnh = tl.program_id(1)
    b = bnh // (N * H)
    n = (bnh // H) % N
    h = bnh % H
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    cols = offs_n < LK
    dmask = offs_d < D
    kv_mask = cols[:, None] & dmask[None, :]
    k = _tile(_bias_ptr(K, tl.load(sk), b, tl.load(sk + 1), n, tl.load(sk + 2), h),
              tl.load(sk + 3), tl.load(sk + 4), offs_n, offs_d, kv_mask)
    v = _tile(_bias_ptr(V, tl.load(sv), b, tl.load(sv + 1), n, tl.load(sv + 2), h),
              tl.load(sv + 3), tl.load(sv + 4), offs_n, offs_d, kv_mask)
    qp = _bias_ptr(Q, tl.load(sq), b, tl.load(sq + 1), n, tl.load(sq + 2), h)
    dop = _bias_ptr(DO, tl.load(sd), b, tl.load(sd + 1), n, tl.load(sd + 2), h)
    p1 = _bias_ptr(B1, tl.load(s1), b, tl.load(s1 + 1), n, tl.load(s1 + 2), h)
    p2 = _bias_ptr(B2, tl.load(s2), b, tl.load(s2 + 1), n, tl.load(s2 + 2), h)
    dk = tl.zeros((BN, BD), tl.float32)
    dv = tl.zeros((BN, BD), tl.float32)
    for start in range(0, LQ, BM):
        offs_m = start + tl.arange(0, BM)
        rows = offs_m < LQ
        q_mask = rows[:, None] & dmask[None, :]
        q = _tile(qp, tl.load(sq + 3), tl.load(sq + 4), offs_m, offs_d, q_mask)
        do = _tile(dop, tl.load(sd + 3), tl.load(sd + 4), offs_m, offs_d, q_mask)
        lse = tl.load(LSE + bnh.to(tl.int64) * LQ + offs_m, mask=rows, other=0.0)
        delta = tl.load(DELTA + bnh.to(tl.int64) * LQ + offs_m, mask=rows, other=0.0)
        s = _scores(q, k, scale, B1, B2, p1, p2, offs_m, offs_n, rows[:, None] & cols[None, :],
                    tl.load(s1 + 3), tl.load(s1 + 4), tl.load(s2 + 3), tl.load(s2 + 4),
                    HAS_B1, HAS_B2, IEEE)
        p = tl.where(rows[:, None] & cols[None, :], tl.exp(s - lse[:, None]), 0.0)
        dv += _dot(tl.trans(p).to(do.dtype), do, IEEE)
        ds = p * (_dot(do, tl.trans(v), IEEE) - delta[:, None])
        dk += _dot(tl.trans(ds).to(q.dtype), q, IEEE)
    out = bnh.to(tl.int64) * LK * D + offs_n[:, None] * D + offs_d[None, :]
    tl.store(DK + out, dk * scale, mask=kv_mask)
    tl.store(DV + out, dv, mask=kv_mask)


@triton.jit
def _acc_bias_grad(G, gb, gn, gh, b, n, h, gm, gk, ds, offs_m, offs_n, rows, cols):
    base = _bias_ptr(G, gb, b, gn, n, gh, h)
    if gm == 0:  # broadcast over queries: one row per block
        tl.atomic_add(base + offs_n * gk, tl.sum(ds, 0), mask=cols)
    else:
        tl.atomic_add(base + offs_m[:, None] * gm + offs_n[None, :] * gk, ds,
                      mask=rows[:, None] & cols[None, :])


@triton.jit
def _bwd_q(Q, K, V, B1, B2, DO, LSE, DELTA, DQ, G1, G2, sq, sk, sv, s1, s2, sd, g1, g2,
           N, H, LQ, LK, D, scale, HAS_B1: tl.constexpr, HAS_B2: tl.constexpr,
           GRAD_B1: tl.constexpr, GRAD_B2: tl.constexpr, IEEE: tl.constexpr,
           BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    pid_m = tl.program_id(0)
    bnh = tl.program_id(1)
    b = bnh // (N * H)
    n = (bnh // H) % N
    h = bnh % H
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    rows = offs_m < LQ
    dmask = offs_d < D
    q_mask = rows[:, None] & dmask[None, :]
    q = _tile(_bias_ptr(Q, tl.load(sq), b, tl.load(sq + 1), n, tl.load(sq + 2), h),
              tl.load(sq + 3), tl.load(sq + 4), offs_m, offs_d, q_mask)
    do = _tile(_bias_ptr(DO, tl.load(sd), b, tl.load(sd + 1), n, tl.load(sd + 2), h),
               tl.load(sd + 3), tl.load(sd + 4), offs_m, offs_d, q_mask)
    kp = _bias_ptr(K, tl.load(sk), b, tl.load(sk + 1), n, tl.load(sk + 2), h)
    vp = _bias_ptr(V, tl.load(sv), b, tl.load(sv + 1), n, tl.load(sv + 2), h)
    p1 = _bias_ptr(B1, tl.load(s1), b, tl.load(s1 + 1), n, tl.load(s1 + 2), h)
    p2 = _bias_ptr(B2, tl.load(s2), b, tl.load(s2 + 1), n, tl.load(s2 + 2), h)
    lse = tl.load(LSE + bnh.to(tl.int64) * LQ + offs_m, mask=rows, other=0.0)
    delta = tl.load(DELTA + bnh.to(tl.int64) * LQ + offs_m, mask=rows, other=0.0)
    dq = tl.zeros((BM, BD), tl.float32)
    for start in range(0, LK, BN):
        offs_n = start + tl.arange(0, BN)
        cols = offs_n < LK
        kv_mask = cols[:, None] & dmask[None, :]
        k = _tile(kp, tl.load(sk + 3), tl.load(sk + 4), offs_n, offs_d, kv_mask)
        v = _tile(vp, tl.load(sv + 3), tl.load(sv + 4), offs_n, offs_d, kv_mask)
        s = _scores(q, k, scale, B1, B2, p1, p2, offs_m, offs_n, rows[:, None] & cols[None, :],
                    tl.load(s1 + 3), tl.load(s1 + 4), tl.load(s2 + 3), tl.load(s2 + 4),
                    HAS_B1, HAS_B2, IEEE)
        p = tl.where(rows[:, None] & cols[None, :], tl.exp(s - lse[:, None]), 0.0)
        ds = p * (_dot(do, tl.trans(v), IEEE) - delta[:, None])
        dq += _dot(ds.to(k.dtype), k, IEEE)
        if GRAD_B1:
            _acc_bias_grad(G1, tl.load(g1), tl.load(g1 + 1), tl.load(g1 + 2), b, n, h, tl.load(g1 + 3),
                           tl.load(g1 + 4), ds, offs_m, offs_n, rows, cols)
        if GRAD_B2:
            _acc_bias_grad(G2, tl.load(g2), tl.load(g2 + 1), tl.load(g2 + 2), b, n, h, tl.load(g2 + 3),
                           tl.load(g2 + 4), ds, offs_m, offs_n, rows, cols)
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
            q, k, v, b1, b2, dout, lse, delta, dk, dv, *s, _strides(dk, dev), rows, heads, lq, lk,
            dim, dim ** -0.5, **common)
        _bwd_q[(triton.cdiv(lq, bm), batch * rows * heads)](
            q, k, v, b1, b2, dout, lse, delta, dq,
            grads[0] if grads[0] is not None else dq, grads[1] if grads[1] is not None else dq,
            *s, _strides(grads[0], dev), _strides(grads[1], dev), rows, heads, lq, lk, dim,
            dim ** -0.5, GRAD_B1=grads[0] is not None, GRAD_B2=grads[1] is not None, **common)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
                *(None if g is None else g.to(b.dtype) for g, b in zip(grads, (bias1, bias2))))
