"""Index tables of a block layout, shared by the Triton kernels and the blocked torch path.

A block-sparse tensor holds the non-zero blocks of a ``[heads, rows, cols]`` layout as
``[batch, nnz, block, block]``, in the order of ``layout.nonzero()`` (head, then row, then
column). The kernels walk it by rows of the layout (softmax, sparse x dense) or by rows of the
transposed layout (the transposed operand of a backward pass), so both orders are precomputed
once per layout:

- CSR (``row_ptr``, ``cols``, ``ids``): for Triton, one program per (head, row) loops over its
  entries;
- ELL (``ell_ids``, ``ell_cols``: every row padded to the longest, pads point at id -1): for
  torch, where a batched matmul wants equal-length rows. Id -1 selects the zero block the torch
  path appends after the real ones, so pads contribute nothing.
"""
from dataclasses import dataclass

import torch


@dataclass
class RowIndex:
    """The non-zero blocks of one layout (or its transpose), row by row."""

    row_ptr: torch.Tensor   # [heads * rows + 1] int32, CSR offsets
    cols: torch.Tensor      # [nnz] int32, column block of each entry
    ids: torch.Tensor       # [nnz] int32, position of the entry in the sparse tensor
    ell_ids: torch.Tensor   # [heads * rows, width] int64, -1 for padding
    ell_cols: torch.Tensor  # [heads * rows, width] int64, 0 for padding
    ell_heads: torch.Tensor  # [heads * rows] int64, the head of each ELL row
    counts: torch.Tensor    # [heads * rows] int64, entries per row
    order: torch.Tensor     # [heads * rows] int64, rows sorted by entry count
    num_rows: int           # block rows per head
    width: int

    def to(self, device):
        return RowIndex(*(getattr(self, f).to(device) for f in
                          ("row_ptr", "cols", "ids", "ell_ids", "ell_cols", "ell_heads", "counts",
                           "order")),
                        self.num_rows, self.width)

    def groups(self, elements_per_row_slot, budget):
        """Rows in groups of similar length, as ``(rows, ids, cols)`` trimmed to the group's
        longest row, each group small enough that ``rows * width * elements_per_row_slot``
        stays near ``budget`` elements: the torch path's gathers never hold more than that, and
        a few long rows (global blocks) do not pad every other row to their length."""
        counts = self.counts.tolist()
        order = self.order.tolist()
        groups, start = [], 0
        while start < len(order):
            end = start + 1
            while end < len(order):
                width = counts[order[end]]
                if width > 1.25 * max(counts[order[start]], 1) + 1 or \
                        (end - start + 1) * width * elements_per_row_slot > budget:
                    break
                end += 1
            rows = self.order[start:end]
            width = max(counts[order[end - 1]], 1)
            groups.append((rows, self.ell_ids[rows, :width], self.ell_cols[rows, :width]))
            start = end
        return groups


def _row_index(layout, ids_of):
    heads, rows, _ = layout.shape
    nz = layout.nonzero()
    counts = layout.sum(-1).reshape(-1)
    row_ptr = torch.zeros(heads * rows + 1, dtype=torch.int64)
    row_ptr[1:] = counts.cumsum(0)
    width = max(int(counts.max()), 1) if counts.numel() else 1
    flat_row = nz[:, 0] * rows + nz[:, 1]
    slot = torch.arange(nz.shape[0]) - row_ptr[flat_row]
    ell_ids = torch.full((heads * rows, width), -1, dtype=torch.int64)
    ell_cols = torch.zeros((heads * rows, width), dtype=torch.int64)
    ell_ids[flat_row, slot] = ids_of
    ell_cols[flat_row, slot] = nz[:, 2]
    return RowIndex(row_ptr.to(torch.int32), nz[:, 2].to(torch.int32), ids_of.to(torch.int32),
                    ell_ids, ell_cols, torch.arange(heads).repeat_interleave(rows), counts,
                    torch.argsort(counts, stable=True), rows, width)


class BlockLayout:
    """A validated layout with its index tables (for the layout and its transpose)."""

    def __init__(self, layout, block):
        if not torch.is_tensor(layout) or layout.dim() != 3:
            raise ValueError(f"layout must be a [heads, row_blocks, col_blocks] tensor, got "
                             f"{type(layout).__name__} of shape {getattr(layout, 'shape', None)}")
        if block not in (16, 32, 64, 128):
            raise ValueError(f"block must be one of 16, 32, 64, 128, got {block!r}")
        layout = (layout.detach().to("cpu") != 0).to(torch.int64)
        if int(layout.sum()) == 0:
            raise ValueError("layout has no non-zero block: nothing would be computed")
        self.layout = layout
        self.block = block
        self.heads, self.rows, self.cols = layout.shape
        self.nnz = int(layout.sum())
        nz = layout.nonzero()
        self.nz_heads, self.nz_rows, self.nz_cols = nz[:, 0], nz[:, 1], nz[:, 2]
        self.by_row = _row_index(layout, torch.arange(self.nnz))
        # the same blocks by rows of the transposed layout: entry (h, c, r) is block (h, r, c)
        ids = torch.zeros_like(layout)
        ids[nz[:, 0], nz[:, 1], nz[:, 2]] = torch.arange(self.nnz)
        transposed = layout.transpose(1, 2)
        nz_t = transposed.nonzero()
        self.by_col = _row_index(transposed, ids[nz_t[:, 0], nz_t[:, 2], nz_t[:, 1]])
        self._on = {}

    @property
    def density(self):
        return self.nnz / float(self.heads * self.rows * self.cols)

    def empty_rows(self):
        """(head, row) pairs of rows without any block: softmax over them is undefined."""
        return (self.layout.sum(-1) == 0).nonzero().tolist()

    def index(self, device, transposed=False):
        """The row index (of the transposed layout when ``transposed``) on ``device``."""
        key = (str(device), transposed)
        if key not in self._on:
            self._on[key] = (self.by_col if transposed else self.by_row).to(device)
        return self._on[key]

    def groups(self, device, transposed, elements_per_row_slot, budget):
        """``RowIndex.groups`` on ``device``, cached per shape of the work."""
        key = ("groups", str(device), transposed, elements_per_row_slot, budget)
        if key not in self._on:
            index = self.by_col if transposed else self.by_row
            self._on[key] = [(rows.to(device), self.heads_of_rows(rows, transposed).to(device),
                              ids.to(device), cols.to(device))
                             for rows, ids, cols in index.groups(elements_per_row_slot, budget)]
        return self._on[key]

    def heads_of_rows(self, rows, transposed=False):
        return (self.by_col if transposed else self.by_row).ell_heads[rows]

    def dense_mask(self):
        """The token-level ``[heads, rows * block, cols * block]`` bool mask (for checks)."""
        b = self.block
        return self.layout.bool().repeat_interleave(b, 1).repeat_interleave(b, 2)
