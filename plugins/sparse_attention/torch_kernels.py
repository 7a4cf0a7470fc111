"""Block-sparse primitives in plain torch: the CPU path (and the fallback wherever Triton is
missing). Forward only: ``matmul`` / ``softmax`` compose them into forward and backward passes.

Work goes by groups of layout rows of similar length (``BlockLayout.groups``): the blocks a
group needs are gathered into dense batches and multiplied with one batched matmul of shape
``[block x K] @ [K x width * block]``, which runs near GEMM speed, instead of one tiny matmul
per block. A group's gathers are capped at ``BUDGET`` elements, so the working memory is that
cap plus the output, which is linear in the number of non-zero blocks.

Conventions: dense operands are the *logical* matrices ``[batch, heads, rows, cols]`` (a
transposed operand is passed as a ``.mT`` view); sparse ones are ``[batch, nnz, block, block]``
in ``layout.nonzero()`` order. Id -1 in an index table selects a zero block appended at the end.
"""
import torch

BUDGET = 1 << 24  # elements gathered at once per group (64 MiB in fp32)


def _acc(dtype):
    """Softmax arithmetic in fp32, or fp64 for fp64 inputs (gradcheck)."""
    return torch.promote_types(dtype, torch.float32)


def _with_zero_block(s):
    return torch.cat([s, s.new_zeros(s.shape[0], 1, *s.shape[2:])], dim=1)


def sdd(a, b, layout):
    """``a @ b`` computed only on the layout's blocks: ``[Z, H, M, K] @ [Z, H, K, N]`` ->
    ``[Z, nnz, block, block]``."""
    z, _, _, k = a.shape
    bl = layout.block
    rows_a = a.unflatten(2, (layout.rows, bl)).flatten(1, 2)       # [Z, H*rows, bl, K]
    cols_b = b.mT.unflatten(2, (layout.cols, bl))                  # [Z, H, cols, bl, K]
    out = a.new_empty(z, layout.nnz + 1, bl, bl)                   # the last block is a sink for pads
    for rows, heads, ids, cols in layout.groups(a.device, False, z * bl * k, BUDGET):
        gathered = cols_b[:, heads[:, None], cols]                 # [Z, R, W, bl, K]
        scores = rows_a[:, rows] @ gathered.flatten(2, 3).mT       # [Z, R, bl, W*bl]
        scores = scores.unflatten(-1, (ids.shape[1], bl)).permute(0, 1, 3, 2, 4)
        out[:, ids.flatten()] = scores.flatten(1, 2)
    return out[:, :layout.nnz]


def dsd(s, transposed, b, layout):
    """``op(S) @ b`` with ``op(S)`` the sparse matrix (its transpose when ``transposed``):
    ``[Z, nnz, bl, bl]`` x ``[Z, H, K, N]`` -> ``[Z, H, M, N]``."""
    z, n = s.shape[0], b.shape[-1]
    bl = layout.block
    op_rows = layout.cols if transposed else layout.rows
    s_ext = _with_zero_block(s)
    rows_b = b.unflatten(2, (b.shape[2] // bl, bl))                # [Z, H, K/bl, bl, N]
    out = b.new_empty(z, layout.heads * op_rows, bl, n)
    for rows, heads, ids, cols in layout.groups(s.device, transposed, z * bl * n, BUDGET):
        blocks = s_ext[:, ids]                                     # [Z, R, W, bl, bl]
        if transposed:
            blocks = blocks.mT
        lhs = blocks.permute(0, 1, 3, 2, 4).flatten(3, 4)          # [Z, R, bl, W*bl]
        rhs = rows_b[:, heads[:, None], cols].flatten(2, 3)        # [Z, R, W*bl, N]
        out[:, rows] = lhs @ rhs
    return out.view(z, layout.heads, op_rows * bl, n)


def dds(a, s, transposed, layout):
    """``a @ op(S)``: ``[Z, H, M, K]`` x sparse -> ``[Z, H, M, N]``, as ``(op(S)^T @ a^T)^T``."""
    return dsd(s, not transposed, a.mT, layout).mT


def _token_index(blocks, bl):
    """Token indices ``[..., bl]`` of the block indices ``blocks``."""
    return blocks[..., None] * bl + torch.arange(bl, device=blocks.device)


def _masked_scores(x_ext, ids, rows, heads, cols, layout, scale, rpe, key_padding, attn):
    """The group's blocks ``[Z, R, W, bl, bl]`` in fp32: scaled, masks added, pads -inf."""
    bl = layout.block
    t = x_ext[:, ids].to(_acc(x_ext.dtype)) * scale
    row_tok = _token_index(rows % layout.rows, bl)[:, None, :, None]   # [R, 1, bl, 1]
    col_tok = _token_index(cols, bl)[:, :, None, :]                     # [R, W, 1, bl]
    if rpe is not None:
        t = t + rpe[heads[:, None, None, None], row_tok, col_tok].to(t.dtype)
    if key_padding is not None:
        t = t + key_padding[:, col_tok].to(t.dtype)
    if attn is not None:
        t = t + attn[row_tok, col_tok].to(t.dtype)
    return t.masked_fill((ids < 0)[:, :, None, None], float("-inf"))


def softmax(x, layout, scale, rpe=None, key_padding=None, attn=None):
    """Row softmax of ``x * scale + rpe + key_padding + attn`` over each layout row's blocks;
    the masks are additive here (``softmax.py`` converts multiplicative ones). ``rpe`` is
    ``[H, M, N]``, ``key_padding`` ``[Z, N]``, ``attn`` ``[M, N]``. A row whose every entry is
    -inf gives zeros, not NaN."""
    bl = layout.block
    z = x.shape[0]
    x_ext = _with_zero_block(x)
    out = torch.empty_like(x_ext)
    for rows, heads, ids, cols in layout.groups(x.device, False, z * bl * bl * 4, BUDGET):
        t = _masked_scores(x_ext, ids, rows, heads, cols, layout, scale, rpe, key_padding, attn)
        peak = t.amax(dim=(2, 4), keepdim=True)
        peak = torch.where(torch.isneginf(peak), torch.zeros_like(peak), peak)
        p = torch.exp(t - peak)
        total = p.sum(dim=(2, 4), keepdim=True)
        p = p / torch.where(total == 0, torch.ones_like(total), total)
        out[:, ids.flatten()] = p.flatten(1, 2).to(x.dtype)
    return out[:, :layout.nnz]


def softmax_backward(y, dy, layout, scale):
    """``dx = scale * y * (dy - sum_row(y * dy))`` over each layout row's blocks."""
    bl = layout.block
    z = y.shape[0]
    y_ext, dy_ext = _with_zero_block(y), _with_zero_block(dy)
    out = torch.empty_like(y_ext)
    for _, _, ids, _ in layout.groups(y.device, False, z * bl * bl * 4, BUDGET):
        yb, dyb = y_ext[:, ids].to(_acc(y.dtype)), dy_ext[:, ids].to(_acc(y.dtype))
        row_dot = (yb * dyb).sum(dim=(2, 4), keepdim=True)
        out[:, ids.flatten()] = (scale * yb * (dyb - row_dot)).flatten(1, 2).to(y.dtype)
    return out[:, :layout.nnz]
