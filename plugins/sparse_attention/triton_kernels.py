"""Block-sparse kernels in Triton: the GPU path, also run on CPU by the Triton interpreter
(``TRITON_INTERPRET=1``) in the tests. Forward only, with the same contract as
``torch_kernels`` (``matmul`` / ``softmax`` build the backward passes from these).

One program per non-zero block (``sdd``) or per (head, layout row) (``dsd``, softmax); the
program walks its row's entries through the CSR tables of ``layout_index``. Dense operands may
be any strided view (a transposed operand costs nothing); sparse ones are contiguous
``[batch, nnz, block, block]``. fp32 dots use IEEE precision (no TF32) so the results track a
torch fp32 reference to 1e-5.

Importing this module needs ``triton`` (the optional extra ``deepspeed[sparse]``).
"""
import torch
import triton
import triton.language as tl

from deepspeed.ops.triton_dot import dot


@triton.jit
def _sdd_kernel(A, B, C, HEADS, ROWS, COLS, K, s_az, s_ah, s_am, s_ak, s_bz, s_bh, s_bk, s_bn,
                s_cz, s_cn, BLOCK: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr):
    n = tl.program_id(0)
    z = tl.program_id(1)
    h = tl.load(HEADS + n)
    r = tl.load(ROWS + n)
    c = tl.load(COLS + n)
    rm = tl.arange(0, BLOCK)
    rk = tl.arange(0, BK)
    a_ptr = A + z * s_az + h * s_ah + (r * BLOCK + rm)[:, None] * s_am
    b_ptr = B + z * s_bz + h * s_bh + (c * BLOCK + rm)[None, :] * s_bn
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(a_ptr + kk[None, :] * s_ak, mask=kk[None, :] < K, other=0.0)
        b = tl.load(b_ptr + kk[:, None] * s_bk, mask=kk[:, None] < K, other=0.0)
        acc += dot(a, b, IEEE)
    tl.store(C + z * s_cz + n * s_cn + rm[:, None] * BLOCK + rm[None, :], acc.to(C.dtype.element_ty))


@triton.jit
def _dsd_kernel(S, B, C, ROW_PTR, COLS, IDS, ROWS_PER_HEAD, N, s_sz, s_sn, s_bz, s_bh, s_bk, s_bn,
                s_cz, s_ch, s_cm, s_cn, BLOCK: tl.constexpr, BN: tl.constexpr,
                TRANS: tl.constexpr, IEEE: tl.constexpr):
    row = tl.program_id(0)
    z = tl.program_id(1)
    h = row // ROWS_PER_HEAD
    r = row % ROWS_PER_HEAD
    start = tl.load(ROW_PTR + row)
    end = tl.load(ROW_PTR + row + 1)
    rm = tl.arange(0, BLOCK)
    rn = tl.program_id(2) * BN + tl.arange(0, BN)
    acc = tl.zeros((BLOCK, BN), dtype=tl.float32)
    for e in range(start, end):
        kb = tl.load(COLS + e)
        base = S + z * s_sz + tl.load(IDS + e).to(tl.int64) * s_sn
        if TRANS:
            a = tl.load(base + rm[None, :] * BLOCK + rm[:, None])
        else:
            a = tl.load(base + rm[:, None] * BLOCK + rm[None, :])
        b = tl.load(B + z * s_bz + h * s_bh + (kb * BLOCK + rm)[:, None] * s_bk + rn[None, :] * s_bn,
                    mask=rn[None, :] < N, other=0.0)
        acc += dot(a, b, IEEE)
    c_ptr = C + z * s_cz + h * s_ch + (r * BLOCK + rm)[:, None] * s_cm + rn[None, :] * s_cn
    tl.store(c_ptr, acc.to(C.dtype.element_ty), mask=rn[None, :] < N)


@triton.jit
def _scores(X, z, h, r, e, COLS, IDS, scale, RPE, s_rh, s_rm, s_rn, KP, s_kz, s_kn, AM, s_am, s_an,
            s_xz, s_xn, BLOCK: tl.constexpr, HAS_RPE: tl.constexpr, HAS_KP: tl.constexpr,
            HAS_AM: tl.constexpr):
    rm = tl.arange(0, BLOCK)
    c = tl.load(COLS + e)
    tok_r = r * BLOCK + rm
    tok_c = c * BLOCK + rm
    off = z * s_xz + tl.load(IDS + e).to(tl.int64) * s_xn + rm[:, None] * BLOCK + rm[None, :]
    t = tl.load(X + off).to(tl.float32) * scale
    if HAS_RPE:
        t += tl.load(RPE + h * s_rh + tok_r[:, None] * s_rm + tok_c[None, :] * s_rn).to(tl.float32)
    if HAS_KP:
        t += tl.load(KP + z * s_kz + tok_c * s_kn).to(tl.float32)[None, :]
    if HAS_AM:
        t += tl.load(AM + tok_r[:, None] * s_am + tok_c[None, :] * s_an).to(tl.float32)
    return t, off


@triton.jit
def _softmax_kernel(X, Y, ROW_PTR, COLS, IDS, ROWS_PER_HEAD, scale, RPE, s_rh, s_rm, s_rn,
                    KP, s_kz, s_kn, AM, s_am, s_an, s_xz, s_xn, BLOCK: tl.constexpr,
                    HAS_RPE: tl.constexpr, HAS_KP: tl.constexpr, HAS_AM: tl.constexpr):
    row = tl.program_id(0)
    z = tl.program_id(1)
    h = row // ROWS_PER_HEAD
    r = row % ROWS_PER_HEAD
    start = tl.load(ROW_PTR + row)
    end = tl.load(ROW_PTR + row + 1)
    peak = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    for e in range(start, end):
        t, _ = _scores(X, z, h, r, e, COLS, IDS, scale, RPE, s_rh, s_rm, s_rn, KP, s_kz, s_kn,
                       AM, s_am, s_an, s_xz, s_xn, BLOCK, HAS_RPE, HAS_KP, HAS_AM)
        peak = tl.maximum(peak, tl.max(t, 1))
    peak = tl.where(peak == float("-inf"), 0.0, peak)
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for e in range(start, end):
        t, _ = _scores(X, z, h, r, e, COLS, IDS, scale, RPE, s_rh, s_rm, s_rn, KP, s_kz, s_kn,
                       AM, s_am, s_an, s_xz, s_xn, BLOCK, HAS_RPE, HAS_KP, HAS_AM)
        total += tl.sum(tl.exp(t - peak[:, None]), 1)
    total = tl.where(total == 0.0, 1.0, total)
    for e in range(start, end):
        t, off = _scores(X, z, h, r, e, COLS, IDS, scale, RPE, s_rh, s_rm, s_rn, KP, s_kz, s_kn,
                         AM, s_am, s_an, s_xz, s_xn, BLOCK, HAS_RPE, HAS_KP, HAS_AM)
        p = tl.exp(t - peak[:, None]) / total[:, None]
        tl.store(Y + off, p.to(Y.dtype.element_ty))


@triton.jit
def _softmax_backward_kernel(Y, DY, DX, ROW_PTR, IDS, scale, s_z, s_n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    z = tl.program_id(1)
    start = tl.load(ROW_PTR + row)
    end = tl.load(ROW_PTR + row + 1)
    rm = tl.arange(0, BLOCK)
    inner = rm[:, None] * BLOCK + rm[None, :]
    row_dot = tl.zeros((BLOCK,), dtype=tl.float32)
    for e in range(start, end):
        off = z * s_z + tl.load(IDS + e).to(tl.int64) * s_n + inner
        row_dot += tl.sum(tl.load(Y + off).to(tl.float32) * tl.load(DY + off).to(tl.float32), 1)
    for e in range(start, end):
        off = z * s_z + tl.load(IDS + e).to(tl.int64) * s_n + inner
        y = tl.load(Y + off).to(tl.float32)
        dx = scale * y * (tl.load(DY + off).to(tl.float32) - row_dot[:, None])
        tl.store(DX + off, dx.to(DX.dtype.element_ty))


def _ieee(t):
    return t.dtype == torch.float32


def sdd(a, b, layout):
    z, _, _, k = a.shape
    out = a.new_empty(z, layout.nnz, layout.block, layout.block)
    heads, rows, cols = (t.to(a.device, torch.int32) for t in
                         (layout.nz_heads, layout.nz_rows, layout.nz_cols))
    bk = min(max(triton.next_power_of_2(k), 16), 64)
    _sdd_kernel[(layout.nnz, z)](a, b, out, heads, rows, cols, k, *a.stride(), *b.stride(),
                                 out.stride(0), out.stride(1), BLOCK=layout.block, BK=bk,
                                 IEEE=_ieee(a))
    return out


def _dsd_into(s, transposed, b, out, layout):
    s = s.contiguous()
    z, n = s.shape[0], b.shape[-1]
    index = layout.index(s.device, transposed)
    op_rows = layout.cols if transposed else layout.rows
    bn = min(max(triton.next_power_of_2(n), 16), 64)
    grid = (layout.heads * op_rows, z, triton.cdiv(n, bn))
    _dsd_kernel[grid](s, b, out, index.row_ptr, index.cols, index.ids, op_rows, n,
                      s.stride(0), s.stride(1), *b.stride(), *out.stride(),
                      BLOCK=layout.block, BN=bn, TRANS=transposed, IEEE=_ieee(s))
    return out


def dsd(s, transposed, b, layout):
    op_rows = layout.cols if transposed else layout.rows
    out = b.new_empty(s.shape[0], layout.heads, op_rows * layout.block, b.shape[-1])
    return _dsd_into(s, transposed, b, out, layout)


def dds(a, s, transposed, layout):
    op_cols = layout.rows if transposed else layout.cols
    out = a.new_empty(a.shape[0], layout.heads, a.shape[2], op_cols * layout.block)
    _dsd_into(s, not transposed, a.mT, out.mT, layout)
    return out


def softmax(x, layout, scale, rpe=None, key_padding=None, attn=None):
    x = x.contiguous()
    out = torch.empty_like(x)
    index = layout.index(x.device)
    dummy = x.new_zeros(1)
    rpe_args = (rpe, *rpe.stride()) if rpe is not None else (dummy, 0, 0, 0)
    kp_args = (key_padding, *key_padding.stride()) if key_padding is not None else (dummy, 0, 0)
    am_args = (attn, *attn.stride()) if attn is not None else (dummy, 0, 0)
    grid = (layout.heads * layout.rows, x.shape[0])
    _softmax_kernel[grid](x, out, index.row_ptr, index.cols, index.ids, layout.rows, float(scale),
                          *rpe_args, *kp_args, *am_args, x.stride(0), x.stride(1),
                          BLOCK=layout.block, HAS_RPE=rpe is not None,
                          HAS_KP=key_padding is not None, HAS_AM=attn is not None)
    return out


def softmax_backward(y, dy, layout, scale):
    y, dy = y.contiguous(), dy.contiguous()
    dx = torch.empty_like(y)
    index = layout.index(y.device)
    grid = (layout.heads * layout.rows, y.shape[0])
    _softmax_backward_kernel[grid](y, dy, dx, index.row_ptr, index.ids, float(scale),
                                   y.stride(0), y.stride(1), BLOCK=layout.block)
    return dx
