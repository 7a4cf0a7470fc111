"""``Softmax``: row softmax over the non-zero blocks of a block-sparse score tensor, with the
attention extras fused in: ``scale``, a relative position embedding ``rpe`` (``[M, N]`` or
``[heads, M, N]``), a key padding mask ``[batch, N]`` and an attention mask ``[M, N]``.

Mask modes: ``add`` adds the mask to the scores (0 keeps, a large negative value drops);
``mul`` treats it as a keep-flag (0 drops, anything else keeps). Both reach the kernels as an
additive mask. Blocks outside the layout take no part; a row left with nothing to attend to
gives zeros rather than NaN. The backward pass returns the gradient of the scores only.
"""
import torch

from deepspeed.sparse_attention.backend import check_backend, kernels_for
from deepspeed.sparse_attention.layout_index import BlockLayout

MASK_MODES = ("add", "mul")


def additive_mask(mask, mode, name):
    if mode not in MASK_MODES:
        raise NotImplementedError(f"{name}_mode={mode!r} is not supported; allowed: "
                                  f"{', '.join(MASK_MODES)}")
    if mask is None:
        return None
    if mode == "mul" or mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(
            mask == 0, float("-inf"))
    return mask


class _SparseSoftmax(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, scale, rpe, key_padding, attn, layout, backend):
        k = kernels_for(x, backend)
        y = k.softmax(x, layout, scale, rpe, key_padding, attn)
        ctx.k, ctx.layout, ctx.scale = k, layout, scale
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        dx = ctx.k.softmax_backward(y, grad.contiguous(), ctx.layout, ctx.scale)
        return dx, None, None, None, None, None, None


class Softmax:
    """Block-sparse softmax for ``layout`` (``[heads, row_blocks, col_blocks]``)."""

    def __init__(self, layout, block, bench=False, backend=None):
        self.layout = layout if isinstance(layout, BlockLayout) else BlockLayout(layout, block)
        self.block = block
        self.backend = check_backend(backend)
        empty = self.layout.empty_rows()
        if empty:
            raise ValueError(f"layout rows without any block have no softmax: (head, row) "
                             f"{empty[:5]}{' ...' if len(empty) > 5 else ''}; every row of the "
                             f"layout needs at least one non-zero block")

    def _check(self, name, t, shape):
        if t is None:
            return None
        if tuple(t.shape) != shape:
            raise ValueError(f"Softmax: {name} must have shape {list(shape)}, got {list(t.shape)}")
        return t

    def __call__(self, x, scale=1.0, rpe=None, key_padding_mask=None, attn_mask=None,
                 key_padding_mask_mode="add", attn_mask_mode="add"):
        L = self.layout
        if x.dim() != 4 or tuple(x.shape[1:]) != (L.nnz, self.block, self.block):
            raise ValueError(f"Softmax: input must be [batch, {L.nnz}, {self.block}, {self.block}] "
                             f"(the layout's non-zero blocks), got {list(x.shape)}")
        m, n = L.rows * self.block, L.cols * self.block
        if rpe is not None:
            rpe = rpe.expand(L.heads, m, n) if rpe.dim() == 2 else self._check("rpe", rpe, (L.heads, m, n))
        key_padding = self._check("key_padding_mask", key_padding_mask, (x.shape[0], n))
        attn = self._check("attn_mask", attn_mask, (m, n))
        key_padding = additive_mask(key_padding, key_padding_mask_mode, "key_padding_mask")
        attn = additive_mask(attn, attn_mask_mode, "attn_mask")
        return _SparseSoftmax.apply(x, float(scale), rpe, key_padding, attn, L, self.backend)
