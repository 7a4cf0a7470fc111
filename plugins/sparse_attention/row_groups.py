"""Fused row-group attention: the CPU path of ``SparseSelfAttention``.

Block rows of a layout that attend to the same set of column blocks (for the Fixed pattern:
all rows of one local window, which share the window and the same global columns) form a
group. Each group is one call of ``torch.nn.functional.scaled_dot_product_attention`` on its
query rows and the gathered key/value blocks of its column set, and groups of equal shape are
stacked along the batch dimension into one call. On CPU that call is torch's fused flash
kernel, so no ``[nnz, block, block]`` score or probability tensor is ever materialised; the
working memory is the gathered keys/values of at most ``BUDGET`` elements at a time plus the
output, linear in the number of non-zero blocks. Contiguous runs of rows or columns are slices
(no copy). Autograd goes through SDPA and the gathers, so the backward pass comes for free.

Heads with identical layouts are processed together; heads with different layouts (e.g.
``different_layout_per_head=True``) form separate head classes. Masks (``rpe``,
``key_padding``, ``attn``: additive, as ``softmax.py`` converts them) are gathered for each
group into SDPA's ``attn_mask``; -inf is replaced by -1e30 so a row that masks out every key
stays finite and is then zeroed, matching the blocked path (zeros, not NaN).

Every layout and every mask ``SparseSelfAttention`` accepts runs here. Layouts whose rows all
differ (sliding windows, random blocks) give groups of one block row (``block`` queries) per
call, which still measured no slower than the blocked path; ``backend="blocked"`` selects the
blocked path (``torch_kernels``) instead.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

BUDGET = 1 << 23           # elements of gathered keys + values held at once (32 MiB in fp32)
MASK_FLOOR = -1e30         # stands in for -inf in SDPA masks: fully masked rows stay finite


@dataclass
class _Stack:
    """Groups of one shape (query block rows x column blocks), run as one batched SDPA."""

    rows: torch.Tensor      # [G, R] block-row indices of each group
    cols: torch.Tensor      # [G, C] column-block indices of each group
    row_slice: tuple        # (start, stop) token slice when G == 1 and rows are contiguous
    col_slice: tuple        # the same for columns


@dataclass
class _HeadClass:
    heads: torch.Tensor     # head indices sharing this layout
    contiguous: tuple       # (start, stop) when the heads are a contiguous range
    stacks: list


def _run(idx):
    """``(start, stop)`` when ``idx`` (a 1-D int tensor) is a contiguous increasing run."""
    n = idx.numel()
    start = int(idx[0])
    if int(idx[-1]) - start == n - 1 and (n == 1 or bool((idx[1:] - idx[:-1] == 1).all())):
        return start, start + n
    return None


def _stacks(layout_2d):
    """The groups of one ``[rows, cols]`` bool layout: rows with identical column sets, then
    groups of one shape stacked."""
    rows_of = {}
    for r, row in enumerate(layout_2d):
        rows_of.setdefault(row.numpy().tobytes(), []).append(r)
    by_shape = {}
    for key_rows in rows_of.values():
        cols = layout_2d[key_rows[0]].nonzero().flatten()
        by_shape.setdefault((len(key_rows), cols.numel()), []).append((key_rows, cols))
    stacks = []
    for groups in by_shape.values():
        rows = torch.tensor([g[0] for g in groups], dtype=torch.int64)
        cols = torch.stack([g[1] for g in groups])
        single = len(groups) == 1
        stacks.append(_Stack(rows, cols, _run(rows[0]) if single else None,
                             _run(cols[0]) if single else None))
    return stacks


def plan(layout):
    """The execution plan of a ``BlockLayout`` (cached on it): its head classes."""
    key = "row_groups"
    if key in layout._on:
        return layout._on[key]
    lay = layout.layout.bool()
    classes, seen = [], {}
    for h in range(layout.heads):
        seen.setdefault(lay[h].numpy().tobytes(), []).append(h)
    for heads in seen.values():
        heads_t = torch.tensor(heads, dtype=torch.int64)
        stacks = _stacks(lay[heads[0]])
        classes.append(_HeadClass(heads_t, _run(heads_t), stacks))
    layout._on[key] = classes
    return classes


def _chunks(stacks, elements_per_col_block):
    """The stacks cut so that one call gathers at most ``BUDGET`` key + value elements."""
    for st in stacks:
        per_group = st.cols.shape[1] * elements_per_col_block
        step = max(1, BUDGET // per_group)
        if st.rows.shape[0] <= step:
            yield st
            continue
        for i in range(0, st.rows.shape[0], step):
            yield _Stack(st.rows[i:i + step], st.cols[i:i + step], None, None)


def _tokens(blocks, bl):
    """Token indices of ``[..., n]`` block indices, flattened to ``[..., n * bl]``."""
    return (blocks[..., None] * bl + torch.arange(bl, device=blocks.device)).flatten(-2)


def _take(x, idx, bl, sl):
    """Tokens of blocks ``idx`` ([G, n]) of ``x`` ([Z, H, S, D]) as ``[Z, H * G, n * bl, D]``
    (groups folded into the head dimension: a view of the gather, no second copy)."""
    if sl is not None:
        return x[:, :, sl[0] * bl:sl[1] * bl]
    return x[:, :, _tokens(idx.to(x.device), bl)].flatten(1, 2)


def _group_mask(stack, bl, heads, rpe, key_padding, attn, device):
    """The additive SDPA mask of a stack, broadcastable to ``[Z, H, G, R*bl, C*bl]``."""
    rt = _tokens(stack.rows.to(device), bl)[:, :, None]              # [G, R*bl, 1]
    ct = _tokens(stack.cols.to(device), bl)[:, None, :]              # [G, 1, C*bl]
    mask = None
    if rpe is not None:                                               # [H, M, N]
        mask = rpe[heads.to(device)[:, None, None, None], rt, ct][None]  # [1, h, G, R*bl, C*bl]
    if key_padding is not None:                                       # [Z, N]
        m = key_padding[:, ct][:, None]                               # [Z, 1, G, 1, C*bl]
        mask = m if mask is None else mask + m
    if attn is not None:                                              # [M, N]
        m = attn[rt, ct][None, None]                                  # [1, 1, G, R*bl, C*bl]
        mask = m if mask is None else mask + m
    return mask.clamp(min=MASK_FLOOR)


def attention(q, k, v, layout, classes, scale, rpe=None, key_padding=None, attn=None):
    """Sparse attention ``[Z, H, S, D]`` for the plan ``classes`` of ``layout``; masks are
    additive (``rpe`` ``[H, S, S]``, ``key_padding`` ``[Z, S]``, ``attn`` ``[S, S]``) and take no
    gradient (as in the blocked path)."""
    bl = layout.block
    z, _, s, d = q.shape
    masked = rpe is not None or key_padding is not None or attn is not None
    if masked:
        dt = torch.promote_types(q.dtype, torch.float32)
        rpe, key_padding, attn = (None if t is None else t.detach().to(q.device, dt)
                                  for t in (rpe, key_padding, attn))
    out = None
    for hc in classes:
        if hc.contiguous is not None:
            hs = slice(*hc.contiguous)
            qh, kh, vh = q[:, hs], k[:, hs], v[:, hs]
        else:
            hi = hc.heads.to(q.device)
            qh, kh, vh = q[:, hi], k[:, hi], v[:, hi]
        nh = qh.shape[1]
        pieces, order = [], []
        for st in _chunks(hc.stacks, z * nh * 2 * bl * d):
            g = st.rows.shape[0]
            qg, kg, vg = (_take(qh, st.rows, bl, st.row_slice), _take(kh, st.cols, bl, st.col_slice),
                          _take(vh, st.cols, bl, st.col_slice))
            mask = None
            if masked:
                mask = _group_mask(st, bl, hc.heads, rpe, key_padding, attn, q.device)
                mask = mask.to(q.dtype)
            if masked:
                mask = mask.expand(z, nh, g, qg.shape[-2], kg.shape[-2]).flatten(1, 2)
            # 4-D operands [Z, h * G, tokens, D]: the fused CPU kernel's layout
            o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, scale=scale)
            if masked:
                o = o.masked_fill((mask <= MASK_FLOOR / 2).all(-1, keepdim=True), 0.0)
            pieces.append(o.unflatten(1, (nh, g)).flatten(2, 3))      # [Z, h, G*R*bl, D]
            order.append(st.rows.flatten())
        order = torch.cat(order)
        o = torch.cat(pieces, 2) if len(pieces) > 1 else pieces[0]
        if not bool((order == torch.arange(order.numel())).all()):
            inv = torch.empty_like(order)
            inv[order] = torch.arange(order.numel())
            o = o[:, :, _tokens(inv.to(q.device), bl)]
        if len(classes) == 1:
            return o
        if out is None:
            out = q.new_zeros(z, layout.heads, s, d)
        out = out.index_copy(1, hc.heads.to(q.device), o)
    return out
