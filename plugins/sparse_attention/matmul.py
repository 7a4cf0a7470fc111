"""``MatMul``: block-sparse matrix products in three modes, with their backward passes.

- ``sdd``: sparse = dense @ dense, computing only the layout's blocks (attention scores);
- ``dsd``: dense = sparse @ dense (probabilities @ values);
- ``dds``: dense = dense @ sparse.

``trans_a`` / ``trans_b`` transpose an operand first; for a sparse operand the layout describes
it as stored (before the transpose). Dense operands are ``[batch, heads, rows, cols]``, sparse
ones ``[batch, nnz, block, block]`` with the blocks in ``layout.nonzero()`` order. Each backward
pass is again one of the three products, so the same kernels (Triton or blocked torch, see
``backend``) serve both directions.
"""
import torch

from deepspeed.sparse_attention.backend import check_backend, kernels_for
from deepspeed.sparse_attention.layout_index import BlockLayout

MODES = ("sdd", "dsd", "dds")


def _t(x, flag):
    return x.mT if flag else x


class _SparseMatMul(torch.autograd.Function):

    @staticmethod
    def forward(ctx, a, b, mode, trans_a, trans_b, layout, backend):
        k = kernels_for(a, backend)
        ctx.mode, ctx.trans_a, ctx.trans_b, ctx.layout, ctx.k = mode, trans_a, trans_b, layout, k
        ctx.save_for_backward(a, b)
        if mode == "sdd":
            return k.sdd(_t(a, trans_a), _t(b, trans_b), layout)
        if mode == "dsd":
            return k.dsd(a, trans_a, _t(b, trans_b), layout)
        return k.dds(_t(a, trans_a), b, trans_b, layout)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        k, layout, ta, tb = ctx.k, ctx.layout, ctx.trans_a, ctx.trans_b
        grad = grad.contiguous()
        da = db = None
        if ctx.mode == "sdd":
            a_op, b_op = _t(a, ta), _t(b, tb)
            if ctx.needs_input_grad[0]:
                da = _t(k.dsd(grad, False, b_op.mT, layout), ta)
            if ctx.needs_input_grad[1]:
                db = _t(k.dds(a_op.mT, grad, False, layout), tb)
        elif ctx.mode == "dsd":
            b_op = _t(b, tb)
            if ctx.needs_input_grad[0]:
                da = k.sdd(b_op, grad.mT, layout) if ta else k.sdd(grad, b_op.mT, layout)
            if ctx.needs_input_grad[1]:
                db = _t(k.dsd(a, not ta, grad, layout), tb)
        else:
            a_op = _t(a, ta)
            if ctx.needs_input_grad[0]:
                da = _t(k.dds(grad, b, not tb, layout), ta)
            if ctx.needs_input_grad[1]:
                db = k.sdd(grad.mT, a_op, layout) if tb else k.sdd(a_op.mT, grad, layout)
        return da, db, None, None, None, None, None


class MatMul:
    """Block-sparse product ``op(a) @ op(b)`` for the layout ``[heads, row_blocks,
    col_blocks]`` with ``block``-sized tiles (16, 32, 64 or 128)."""

    def __init__(self, layout, block, mode, trans_a=False, trans_b=False, bench=False, backend=None):
        if mode not in MODES:
            raise NotImplementedError(f"MatMul mode {mode!r} is not supported; allowed: "
                                      f"{', '.join(MODES)}")
        self.layout = layout if isinstance(layout, BlockLayout) else BlockLayout(layout, block)
        self.block, self.mode = block, mode
        self.trans_a, self.trans_b = bool(trans_a), bool(trans_b)
        self.backend = check_backend(backend)

    def _check_dense(self, name, x, rows, cols, transposed):
        if not torch.is_tensor(x) or x.dim() != 4:
            raise ValueError(f"MatMul({self.mode}): dense operand {name} must be [batch, heads, "
                             f"rows, cols], got shape {tuple(getattr(x, 'shape', ()))}")
        if x.shape[1] != self.layout.heads:
            raise ValueError(f"MatMul({self.mode}): operand {name} has {x.shape[1]} heads but the "
                             f"layout has {self.layout.heads}")
        shape = tuple(_t(x, transposed).shape[2:])
        for got, want, what in zip(shape, (rows, cols), ("rows", "columns")):
            if want is not None and got != want:
                raise ValueError(
                    f"MatMul({self.mode}): operand {name}{'^T' if transposed else ''} has {got} "
                    f"{what} where the layout (block {self.block}) needs {want}; sequence lengths "
                    f"must be multiples of the block (pad with "
                    f"SparseAttentionUtils.pad_to_block_size)")
        return shape

    def _check_sparse(self, name, x):
        want = (self.layout.nnz, self.block, self.block)
        if not torch.is_tensor(x) or x.dim() != 4 or tuple(x.shape[1:]) != want:
            raise ValueError(f"MatMul({self.mode}): sparse operand {name} must be [batch, "
                             f"{want[0]}, {want[1]}, {want[2]}] (the layout's non-zero blocks), "
                             f"got shape {tuple(getattr(x, 'shape', ()))}")

    def __call__(self, a, b):
        L, bl = self.layout, self.block
        if self.mode == "sdd":
            _, inner = self._check_dense("a", a, L.rows * bl, None, self.trans_a)
            self._check_dense("b", b, inner, L.cols * bl, self.trans_b)
        elif self.mode == "dsd":
            self._check_sparse("a", a)
            inner = (L.rows if self.trans_a else L.cols) * bl
            self._check_dense("b", b, inner, None, self.trans_b)
        else:
            self._check_sparse("b", b)
            inner = (L.cols if self.trans_b else L.rows) * bl
            self._check_dense("a", a, None, inner, self.trans_a)
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"MatMul({self.mode}): batch sizes differ ({a.shape[0]} vs {b.shape[0]})")
        if a.dtype != b.dtype or a.device != b.device:
            raise ValueError(f"MatMul({self.mode}): operands must share dtype and device, got "
                             f"{a.dtype}/{a.device} and {b.dtype}/{b.device}")
        return _SparseMatMul.apply(a, b, self.mode, self.trans_a, self.trans_b, L, self.backend)
