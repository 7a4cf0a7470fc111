"""Plain-torch references for the block-sparse ops: dense computations masked by the layout.
Used by the tests in this folder and by ``triton_checks.py`` (run under the interpreter)."""
import torch

from deepspeed.sparse_attention import FixedSparsityConfig


def layout_for(heads, seq, block, seed=0):
    """A per-head Fixed layout with different global patterns (and so different heads)."""
    cfg = FixedSparsityConfig(heads, block=block, different_layout_per_head=True, num_local_blocks=2,
                              num_global_blocks=1, num_different_global_patterns=min(heads, 2))
    return cfg.make_layout(seq)


def token_mask(layout, block):
    return layout.bool().repeat_interleave(block, 1).repeat_interleave(block, 2)


def to_blocks(dense, layout, block):
    """``[Z, H, M, N]`` -> ``[Z, nnz, block, block]`` in ``layout.nonzero()`` order."""
    nz = layout.nonzero()
    tiles = dense.unflatten(2, (-1, block)).unflatten(4, (-1, block)).permute(0, 1, 2, 4, 3, 5)
    return tiles[:, nz[:, 0], nz[:, 1], nz[:, 2]]


def to_dense(blocks, layout, block):
    """``[Z, nnz, block, block]`` -> ``[Z, H, M, N]`` with zeros outside the layout."""
    z = blocks.shape[0]
    h, r, c = layout.shape
    nz = layout.nonzero()
    tiles = blocks.new_zeros(z, h, r, c, block, block)
    tiles = tiles.index_put((torch.arange(z)[:, None], nz[:, 0][None], nz[:, 1][None], nz[:, 2][None]), blocks)
    return tiles.permute(0, 1, 2, 4, 3, 5).reshape(z, h, r * block, c * block)


def dense_softmax(x_dense, layout, block, scale=1.0, rpe=None, key_padding=None, attn=None):
    """Reference softmax over the layout's entries; masks additive."""
    t = x_dense * scale
    if rpe is not None:
        t = t + rpe
    if key_padding is not None:
        t = t + key_padding[:, None, None, :]
    if attn is not None:
        t = t + attn
    return torch.softmax(t.masked_fill(~token_mask(layout, block), float("-inf")), -1)


def dense_operands(mode, trans_a, trans_b, z, h, seq, k, layout, block, dtype, gen):
    """(a, b) in the shapes MatMul(mode, trans_a, trans_b) takes, and a function computing the
    reference output from them with dense torch ops."""
    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)

    def t(x, flag):
        return x.mT if flag else x

    if mode == "sdd":
        a = rnd(z, h, k, seq) if trans_a else rnd(z, h, seq, k)
        b = rnd(z, h, seq, k) if trans_b else rnd(z, h, k, seq)
        return a, b, lambda a, b: to_blocks(t(a, trans_a) @ t(b, trans_b), layout, block)
    nnz = int(layout.sum())
    s = rnd(z, nnz, block, block)
    if mode == "dsd":
        b = rnd(z, h, k, seq) if trans_b else rnd(z, h, seq, k)
        return s, b, lambda s, b: t(to_dense(s, layout, block), trans_a) @ t(b, trans_b)
    a = rnd(z, h, seq, k) if trans_a else rnd(z, h, k, seq)
    return a, s, lambda a, s: t(a, trans_a) @ t(to_dense(s, layout, block), trans_b)
