"""Fused row-group attention: the CPU path of ``SparseSelfAttention``.

The layout's column blocks that every row of a head class attends to (for the Fixed pattern:
the global columns) are the *shared* part: one attention call of all queries against those
keys, gathered once. The rest of each row's columns (for Fixed: its local window) is its
*residual*; block rows with the same residual form a group, groups of one shape are stacked
along the head dimension, and each stack is one more attention call on its query rows and the
gathered residual key/value blocks. The partial results are merged with their log-sum-exps
(flash-attention style): ``O = sum_i O_i exp(lse_i - lse)``, ``lse = logsumexp_i lse_i``.

Each call is torch's fused CPU flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``, which also returns the log-sum-exp), so
no ``[nnz, block, block]`` score or probability tensor is materialised and the shared keys are
not copied once per row. The backward pass calls the kernel's backward once per part with the
*merged* output and log-sum-exp: that gives exactly each part's share of the full gradient.
Working memory: the gathered keys/values (the shared set once, the residual stacks at most
``BUDGET`` elements at a time), the output and the log-sum-exp: linear in the non-zero blocks.

Heads with identical layouts run together; heads with different layouts
(``different_layout_per_head=True``) form separate head classes. Masks (``rpe``,
``key_padding``, ``attn``: additive, as ``softmax.py`` converts them) are gathered per part into
the kernel's ``attn_mask``; -inf becomes -1e30 so a row that masks out every key stays finite,
and it is then zeroed, as in the blocked path (zeros, not NaN). The masks take no gradient.

Every layout and mask ``SparseSelfAttention`` accepts runs here, for CPU tensors. On a GPU the
same plan runs on torch's CUDA flash kernel (``aten._scaled_dot_product_flash_attention`` and its
backward, which also return and take the log-sum-exp) for fp16/bf16 inputs without masks and a
head dimension the kernel takes (``cuda_eligible``), with ``backend="torch"``; other CUDA
inputs, and ``backend="blocked"``, use the blocked path (``torch_kernels``).
"""
from dataclasses import dataclass, field

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
    shared: torch.Tensor    # column blocks every row attends to (may be empty)
    shared_slice: tuple     # (start, stop) when those are a contiguous run
    stacks: list            # the residual groups
    tokens: dict = field(default_factory=dict)  # token indices per (blocks, device): _tokens_on


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
        if not bool(row.any()):
            continue  # nothing left beyond the shared columns
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
        one = lay[heads[0]]
        shared = one.all(0)
        shared_cols = shared.nonzero().flatten()
        classes.append(_HeadClass(heads_t, _run(heads_t), shared_cols,
                                  _run(shared_cols) if shared_cols.numel() else None,
                                  _stacks(one & ~shared)))
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


def _tokens_on(cache, blocks, bl, device):
    """``_tokens(blocks, bl)`` on ``device``, made once per head class: on a GPU each fresh one
    is a host-to-device copy the stream waits for, and an H200 spent ~1.2 ms per call of a 4K
    sequence making them. ``blocks`` is always a view of the plan's own tensors, which the
    cache's owner keeps alive, so its address names it."""
    if not blocks.is_contiguous():  # a copy, not a view: its address names nothing lasting
        return _tokens(blocks.to(device), bl)
    key = (blocks.data_ptr(), tuple(blocks.shape), bl, str(device))
    found = cache.get(key)
    if found is None:
        found = cache[key] = _tokens(blocks.to(device), bl)
    return found


def _take(x, idx, bl, sl, cache):
    """Tokens of blocks ``idx`` ([G, n]) of ``x`` ([Z, H, S, D]) as ``[Z, H * G, n * bl, D]``
    (groups folded into the head dimension: a view of the gather, no second copy)."""
    if sl is not None:
        return x[:, :, sl[0] * bl:sl[1] * bl]
    return x[:, :, _tokens_on(cache, idx, bl, x.device)].flatten(1, 2)


class _CpuFlash:
    """torch's fused CPU flash kernel; masks go in as ``attn_mask``."""

    @staticmethod
    def forward(q, k, v, mask, scale):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, attn_mask=mask, scale=scale)
        return out, lse, None

    @staticmethod
    def backward(grad, q, k, v, out, lse, mask, scale, _meta):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=scale)


class _CudaFlash:
    """torch's CUDA flash kernel (no mask); the forward's bookkeeping outputs (sequence
    offsets, lengths, RNG state) are kept per part and handed to its backward unchanged."""

    @staticmethod
    def forward(q, k, v, mask, scale):
        assert mask is None, "the CUDA flash path takes no mask (see cuda_eligible)"
        out, lse, cum_q, cum_k, max_q, max_k, rng, unused, _ = \
            torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False,
                                                               scale=scale)
        return out, lse, (cum_q, cum_k, max_q, max_k, rng, unused)

    @staticmethod
    def backward(grad, q, k, v, out, lse, mask, scale, meta):
        cum_q, cum_k, max_q, max_k, rng, unused = meta
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, False, rng, unused,
            scale=scale)


def cuda_eligible(query, masked):
    """Whether the row-group plan can run ``query``'s attention on the CUDA flash kernel."""
    return (query.is_cuda and not masked and query.dtype in (torch.float16, torch.bfloat16)
            and query.shape[-1] % 8 == 0 and query.shape[-1] <= 256)


def _kernels(q):
    return _CudaFlash if q.is_cuda else _CpuFlash


def _parts(hc, z, bl, d):
    """``(rows, cols, row_slice, col_slice)`` of each call: the shared part (all rows; ``rows``
    None) and the residual stacks cut to ``BUDGET``."""
    if hc.shared.numel():
        yield None, hc.shared[None], (0, None), hc.shared_slice
    for st in _chunks(hc.stacks, z * len(hc.heads) * 2 * bl * d):
        yield st.rows, st.cols, st.row_slice, st.col_slice


def _rows_of(x, rows, bl, sl, cache):
    """Rows (tokens) of ``x`` ([Z, h, S, ...]) for a part, as ``[Z, h * G, R*bl, ...]``."""
    if sl is not None:
        return x[:, :, sl[0] * bl:None if sl[1] is None else sl[1] * bl]
    return x[:, :, _tokens_on(cache, rows, bl, x.device)].flatten(1, 2)


class _Merged(torch.autograd.Function):
    """Attention of one head class ``[Z, h, S, D]`` as the LSE-merge of its parts."""

    @staticmethod
    def forward(ctx, q, k, v, hc, bl, scale, masks):
        z, nh, s, d = q.shape
        acc = torch.promote_types(q.dtype, torch.float32)
        out = lse = None
        kernels, metas = _kernels(q), []
        for (rows, cols, rsl, csl), mask in zip(_parts(hc, z, bl, d), masks):
            o, l, meta = kernels.forward(_rows_of(q, rows, bl, rsl, hc.tokens),
                                         _take(k, cols, bl, csl, hc.tokens),
                                         _take(v, cols, bl, csl, hc.tokens), mask, scale)
            metas.append(meta)
            g = 1 if rows is None else rows.shape[0]
            o = o.unflatten(1, (nh, g)).flatten(2, 3).to(acc)
            l = l.unflatten(1, (nh, g)).flatten(2, 3).to(acc)
            if rows is None:            # the shared part: every row, first
                out, lse = o, l
                continue
            if out is None:
                out = q.new_zeros(z, nh, s, d, dtype=acc)
                lse = q.new_full((z, nh, s), float("-inf"), dtype=acc)
            run = _run(rows.flatten())
            if run is not None:         # a contiguous run of rows: merge in place, no gather
                sl = slice(run[0] * bl, run[1] * bl)
                old_o, old_l = out[:, :, sl], lse[:, :, sl]
            else:
                tok = _tokens_on(hc.tokens, rows.flatten(), bl, q.device)
                old_o, old_l = out[:, :, tok], lse[:, :, tok]
            new_l = torch.logaddexp(old_l, l)
            old_o.mul_(torch.exp(old_l - new_l)[..., None]).add_(o.mul_(torch.exp(l - new_l)[..., None]))
            if run is not None:
                old_l.copy_(new_l)
            else:
                out.index_copy_(2, tok, old_o)
                lse.index_copy_(2, tok, new_l)
        dead = None
        if any(m is not None for m in masks):
            dead = lse <= MASK_FLOOR / 2
            out.masked_fill_(dead[..., None], 0.0)
        out = out.to(q.dtype)
        ctx.hc, ctx.bl, ctx.scale, ctx.masks, ctx.dead = hc, bl, scale, masks, dead
        ctx.kernels, ctx.metas = kernels, metas
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        hc, bl, scale = ctx.hc, ctx.bl, ctx.scale
        z, nh, s, d = q.shape
        grad = grad.contiguous()
        if ctx.dead is not None:
            grad = grad.masked_fill(ctx.dead[..., None], 0.0)
        lse = lse.to(torch.float32) if q.dtype != torch.float64 else lse
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for (rows, cols, rsl, csl), mask, meta in zip(_parts(hc, z, bl, d), ctx.masks,
                                                       ctx.metas):
            gq, gk, gv = ctx.kernels.backward(
                _rows_of(grad, rows, bl, rsl, hc.tokens), _rows_of(q, rows, bl, rsl, hc.tokens),
                _take(k, cols, bl, csl, hc.tokens), _take(v, cols, bl, csl, hc.tokens),
                _rows_of(out, rows, bl, rsl, hc.tokens),
                _rows_of(lse, rows, bl, rsl, hc.tokens).contiguous(), mask, scale, meta)
            g = 1 if rows is None else rows.shape[0]
            gq = gq.unflatten(1, (nh, g)).flatten(2, 3)
            if rows is None:
                dq += gq
            else:
                dq.index_add_(2, _tokens_on(hc.tokens, rows.flatten(), bl, q.device), gq)
            ctok = _tokens_on(hc.tokens, cols.flatten(), bl, q.device)
            dk.index_add_(2, ctok, gk.unflatten(1, (nh, g)).flatten(2, 3))
            dv.index_add_(2, ctok, gv.unflatten(1, (nh, g)).flatten(2, 3))
        return dq, dk, dv, None, None, None, None


def _group_mask(rows, cols, s, bl, heads, rpe, key_padding, attn, z, dtype):
    """The additive mask of a part ``[Z, h * G, R*bl, C*bl]`` (rows None: all ``s`` rows)."""
    device = (rpe if rpe is not None else key_padding if key_padding is not None else attn).device
    rt = (torch.arange(s, device=device)[None] if rows is None
          else _tokens(rows.to(device), bl))[:, :, None]             # [G, R*bl, 1]
    ct = _tokens(cols.to(device), bl)[:, None, :]                    # [G, 1, C*bl]
    mask = None
    if rpe is not None:                                               # [H, M, N]
        mask = rpe[heads.to(device)[:, None, None, None], rt, ct][None]  # [1, h, G, R*bl, C*bl]
    if key_padding is not None:                                       # [Z, N]
        m = key_padding[:, ct][:, None]                               # [Z, 1, G, 1, C*bl]
        mask = m if mask is None else mask + m
    if attn is not None:                                              # [M, N]
        m = attn[rt, ct][None, None]                                  # [1, 1, G, R*bl, C*bl]
        mask = m if mask is None else mask + m
    g = ct.shape[0]
    mask = mask.clamp(min=MASK_FLOOR).to(dtype)
    return mask.expand(z, len(heads), g, rt.shape[1], ct.shape[2]).flatten(1, 2)


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
        masks = [_group_mask(rows, cols, s, bl, hc.heads, rpe, key_padding, attn, z, q.dtype)
                 if masked else None for rows, cols, _, _ in _parts(hc, z, bl, d)]
        o = _Merged.apply(qh, kh, vh, hc, bl, scale, masks)
        if len(classes) == 1:
            return o
        if out is None:
            out = q.new_zeros(z, layout.heads, s, d)
        out = out.index_copy(1, hc.heads.to(q.device), o)
    return out
