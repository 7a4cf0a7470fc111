"""The transformer layer's fused blocks in Triton: the GPU path (``transformer.py`` picks it for
CUDA tensors), also run on CPU by the Triton interpreter (``TRITON_INTERPRET=1``) in the tests.

- ``add_layer_norm``: residual add + LayerNorm in one pass over each row, forward and backward
  (the backward reads the saved sum, or with ``normalize_invertible`` rebuilds the normalised
  input from the saved *output*, so the sum is never kept);
- ``gelu``: bias add + erf-GeLU, forward and backward, keeping only its input;
- ``bias_gelu_linear``: the ``gelu_checkpoint`` block of ``torch_ops`` with these kernels.

Attention is SDPA (flash attention on GPU), the matmuls are cuBLAS: fusing those is what the
vendor libraries already do best. Same interface as ``torch_ops``.

Importing this module needs ``triton``.
"""
import torch
import triton
import triton.language as tl

from deepspeed.ops.transformer import torch_ops

FUSED_BIAS_GELU = True  # the layer passes the intermediate bias to ``gelu`` instead of addmm
MAX_HIDDEN = 16384
attention = torch_ops.attention
dropout = torch_ops.dropout


@triton.jit
def _ln_fwd(X, R, W, B, Y, S, MEAN, RSTD, H, eps, HAS_R: tl.constexpr, SAVE_S: tl.constexpr,
            BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    s = tl.load(X + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_R:
        s += tl.load(R + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(s, 0) / H
    diff = tl.where(mask, s - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, 0) / H + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * H + cols, (diff * rstd * w + b).to(Y.dtype.element_ty), mask=mask)
    if SAVE_S:
        tl.store(S + row * H + cols, s.to(S.dtype.element_ty), mask=mask)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


@triton.jit
def _ln_bwd(DY, SAVED, W, B, MEAN, RSTD, DX, DW, DB, ROWS, H, ROWS_PER_PROG,
            INVERTIBLE: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    w = tl.load(W + cols, mask=mask, other=1.0).to(tl.float32)
    b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), tl.float32)
    db = tl.zeros((BLOCK,), tl.float32)
    for i in range(0, ROWS_PER_PROG):
        row = (pid * ROWS_PER_PROG + i).to(tl.int64)
        if row < ROWS:
            dy = tl.load(DY + row * H + cols, mask=mask, other=0.0).to(tl.float32)
            saved = tl.load(SAVED + row * H + cols, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + row)
            if INVERTIBLE:
                xhat = tl.where(mask, (saved - b) / w, 0.0)
            else:
                xhat = tl.where(mask, (saved - tl.load(MEAN + row)) * rstd, 0.0)
            wdy = w * dy
            c1 = tl.sum(xhat * wdy, 0) / H
            c2 = tl.sum(wdy, 0) / H
            dx = (wdy - (xhat * c1 + c2)) * rstd
            tl.store(DX + row * H + cols, dx.to(DX.dtype.element_ty), mask=mask)
            dw += dy * xhat
            db += dy
    tl.store(DW + pid * H + cols, dw, mask=mask)
    tl.store(DB + pid * H + cols, db, mask=mask)


class _AddLayerNorm(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, invertible):
        h = x.shape[-1]
        x2 = x.contiguous().view(-1, h)
        rows = x2.shape[0]
        y = torch.empty_like(x2)
        mean = torch.empty(rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
        save_s = residual is not None and not invertible
        s = torch.empty_like(x2) if save_s else x2
        r = residual.contiguous().view(-1, h) if residual is not None else x2
        _ln_fwd[(rows, )](x2, r, weight, bias, y, s, mean, rstd, h, eps, HAS_R=residual is not None,
                          SAVE_S=save_s, BLOCK=triton.next_power_of_2(h))
        ctx.invertible, ctx.shape, ctx.has_residual = invertible, x.shape, residual is not None
        ctx.save_for_backward(y if invertible else s, weight, bias, mean, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        saved, weight, bias, mean, rstd = ctx.saved_tensors
        rows, h = saved.shape
        dy = dy.contiguous().view(rows, h)
        dx = torch.empty_like(dy)
        per_prog = max(1, triton.cdiv(rows, 256 if dy.is_cuda else 4))
        programs = triton.cdiv(rows, per_prog)
        dw = torch.empty(programs, h, dtype=torch.float32, device=dy.device)
        db = torch.empty_like(dw)
        _ln_bwd[(programs, )](dy, saved, weight, bias, mean, rstd, dx, dw, db, rows, h, per_prog,
                              INVERTIBLE=ctx.invertible, BLOCK=triton.next_power_of_2(h))
        dx = dx.view(ctx.shape)
        return (dx, dx if ctx.has_residual else None, dw.sum(0).to(weight.dtype),
                db.sum(0).to(bias.dtype), None, None)


def add_layer_norm(x, residual, weight, bias, eps, invertible):
    """``LayerNorm(x + residual)``; ``residual`` may be None."""
    if x.shape[-1] > MAX_HIDDEN:
        raise ValueError(f"transformer kernel: hidden size {x.shape[-1]} is above the Triton "
                         f"LayerNorm kernel's limit of {MAX_HIDDEN}; use backend 'torch'")
    return _AddLayerNorm.apply(x, residual, weight, bias, eps, invertible)


@triton.jit
def _gelu_fwd(Z, BIAS, G, N, I, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    z = tl.load(Z + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        z += tl.load(BIAS + offs % I, mask=mask, other=0.0).to(tl.float32)
    g = 0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476))
    tl.store(G + offs, g.to(G.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_bwd(DG, Z, BIAS, DZ, N, I, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    z = tl.load(Z + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        z += tl.load(BIAS + offs % I, mask=mask, other=0.0).to(tl.float32)
    cdf = 0.5 * (1.0 + tl.math.erf(z * 0.7071067811865476))
    pdf = tl.exp(-0.5 * z * z) * 0.3989422804014327
    dg = tl.load(DG + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(DZ + offs, (dg * (cdf + z * pdf)).to(DZ.dtype.element_ty), mask=mask)


def _launch(kernel, *tensors, z, bias):
    n = z.numel()
    block = 1024
    kernel[(triton.cdiv(n, block), )](*tensors, n, z.shape[-1], HAS_BIAS=bias is not None, BLOCK=block)


def gelu_forward(z, bias=None):
    """``gelu(z + bias)`` (no autograd)."""
    z = z.contiguous()
    g = torch.empty_like(z)
    _launch(_gelu_fwd, z, bias if bias is not None else z, g, z=z, bias=bias)
    return g


def gelu_backward(dg, z, bias=None):
    """(d z, d bias) of ``gelu(z + bias)``."""
    z = z.contiguous()
    dz = torch.empty_like(z)
    _launch(_gelu_bwd, dg.contiguous(), z, bias if bias is not None else z, dz, z=z, bias=bias)
    return dz, (None if bias is None else dz.reshape(-1, dz.shape[-1]).float().sum(0).to(bias.dtype))


class _Gelu(torch.autograd.Function):

    @staticmethod
    def forward(ctx, z, bias):
        ctx.save_for_backward(z, bias)
        return gelu_forward(z, bias)

    @staticmethod
    def backward(ctx, dg):
        z, bias = ctx.saved_tensors
        return gelu_backward(dg, z, bias)


def gelu(z, bias=None):
    return _Gelu.apply(z, bias)


def bias_gelu_linear(z, bias, w, b):
    return torch_ops.GeluLinear.apply(z, bias, w, b, gelu_forward, gelu_backward)
