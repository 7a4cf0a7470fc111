"""The transformer layer's building blocks in torch ops: the CPU path (and the GPU fallback).

Each block is what the layer needs with one memory flag on or off; the flag decides what
autograd keeps for backward, never the result:

- ``add_layer_norm(..., invertible=True)`` (``normalize_invertible``) keeps the LayerNorm's
  *output* instead of its input and rebuilds the input from it in backward
  (``x = (y - beta) / gamma / rstd + mean``); the output is kept anyway by the next matmul.
- ``bias_gelu_linear`` (``gelu_checkpoint``) keeps the GeLU *input* only and recomputes the GeLU
  output, the ``[tokens, intermediate]`` activation the output projection would keep.
- ``dropout_matmul`` (``attn_dropout_checkpoint``) keeps the softmax output and a 1-byte mask,
  and recomputes the dropped probabilities instead of keeping them for the ``@ V`` product.

The backward passes call the same aten kernels autograd would, so with a flag on the gradients
equal those with it off up to the rounding of the rebuilt input.
"""
import torch
import torch.nn.functional as F

aten = torch.ops.aten


class _InvertibleLayerNorm(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = aten.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)
        ctx.save_for_backward(y, weight, bias, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        y, weight, bias, mean, rstd = ctx.saved_tensors
        # rebuilt in fp32 and handed back in y's dtype: on CUDA a half-precision LayerNorm keeps
        # mean / rstd in fp32 (on CPU in the input's dtype), and the backward kernel wants its
        # input in the dtype of dy and weight, so a mixed-dtype rebuild fails there
        x = ((y.float() - bias.float()) / weight.float() / rstd.float() + mean.float()).to(y.dtype)
        dx, dw, db = aten.native_layer_norm_backward(dy, x, [y.shape[-1]], mean, rstd, weight, bias,
                                                     [True, True, True])
        return dx, dw, db, None


def add_layer_norm(x, residual, weight, bias, eps, invertible):
    """``LayerNorm(x + residual)``; ``residual`` may be None."""
    s = x if residual is None else x + residual
    if invertible:
        return _InvertibleLayerNorm.apply(s, weight, bias, eps)
    return F.layer_norm(s, (s.shape[-1],), weight, bias, eps)


def gelu(z, bias=None):
    return F.gelu(z if bias is None else z + bias)


def gelu_backward(dg, z, bias=None):
    """(d z, d bias) of ``gelu(z + bias)``."""
    dz = aten.gelu_backward(dg, z if bias is None else z + bias, approximate="none")
    return dz, (None if bias is None else dz.reshape(-1, dz.shape[-1]).sum(0))


class GeluLinear(torch.autograd.Function):
    """``linear(gelu(z + bias), w, b)`` keeping ``z`` only (``gelu_checkpoint``).

    ``act``/``act_backward`` are the GeLU of the path in use (torch here, Triton on GPU).
    """

    @staticmethod
    def forward(ctx, z, bias, w, b, act, act_backward):
        ctx.act, ctx.act_backward = act, act_backward
        ctx.save_for_backward(z, bias, w)
        return F.linear(act(z, bias), w, b)

    @staticmethod
    def backward(ctx, dout):
        z, bias, w = ctx.saved_tensors
        g = ctx.act(z, bias)
        dout2 = dout.reshape(-1, dout.shape[-1])
        dw = dout2.t() @ g.reshape(-1, g.shape[-1])
        db = dout2.sum(0)
        dz, dbias = ctx.act_backward(dout @ w, z, bias)
        return dz, dbias, dw, db, None, None


def bias_gelu_linear(z, bias, w, b):
    return GeluLinear.apply(z, bias, w, b, gelu, gelu_backward)


class _DropoutMatmul(torch.autograd.Function):
    """``(probs * mask / keep) @ v`` keeping ``probs`` and the bool ``mask``."""

    @staticmethod
    def forward(ctx, probs, mask, v, keep):
        ctx.keep = keep
        ctx.save_for_backward(probs, mask, v)
        return (probs * mask / keep) @ v

    @staticmethod
    def backward(ctx, dctx):
        probs, mask, v = ctx.saved_tensors
        dropped = probs * mask / ctx.keep
        dv = dropped.transpose(-1, -2) @ dctx
        dprobs = (dctx @ v.transpose(-1, -2)) * mask / ctx.keep
        return dprobs, None, dv, None


def dropout_mask(like, p, generator):
    """A bool keep-mask with keep probability ``1 - p``, drawn from ``generator`` (None: global)."""
    return torch.empty_like(like).bernoulli_(1.0 - p, generator=generator).bool()


def dropout(x, p, generator):
    if generator is None:
        return F.dropout(x, p, training=True)
    return x * dropout_mask(x, p, generator) / (1.0 - p)


def attention(q, k, v, mask, p, checkpoint, stochastic, generator):
    """Multi-head attention over ``[batch, heads, seq, head_dim]`` with an additive ``mask``.

    Without attention dropout (``p == 0``: eval, or a ratio of 0) it is one SDPA call, which keeps
    no probability matrix at all. With dropout, ``stochastic`` (``stochastic_mode``) lets SDPA draw
    the dropout itself: fastest, but its random stream is not the layer's seeded one. Otherwise the
    probabilities are explicit so the seeded mask applies, and ``checkpoint``
    (``attn_dropout_checkpoint``) drops the dropped probabilities from what backward keeps.
    """
    if p == 0 or stochastic:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if mask is not None:
        scores = scores + mask
    probs = torch.softmax(scores, dim=-1)
    keep = dropout_mask(probs, p, generator)
    if checkpoint:
        # v is a view of the fused qkv projection: keeping it would keep all of q, k and v
        return _DropoutMatmul.apply(probs, keep, v.contiguous(), 1.0 - p)
    return (probs * keep.to(probs.dtype) / (1.0 - p)) @ v
FUSED_BIAS_GELU = False
