"""Block sparsity patterns: which ``block x block`` tiles of the attention scores are computed.

A config's ``make_layout(seq_len)`` returns an int64 tensor ``[num_heads, seq_len // block,
seq_len // block]`` of 0/1: row ``i``, column ``j`` is 1 when the queries of block ``i`` attend
to the keys of block ``j``. The kernels (``MatMul``, ``Softmax``) accept any such layout, so a
new pattern is a subclass that overrides ``make_layout``. The layout is built for one head
and copied to the others unless ``different_layout_per_head`` is set (random blocks, or
``num_different_global_patterns > 1``, then differ per head).

This module holds the base class, the dense pattern and the two windowed patterns with
representative ("global") blocks: Fixed (Sparse Transformer) and Variable. BigBird,
BSLongformer and the sliding window live in ``sparsity_patterns``.
"""
import random

from deepspeed.utils.lazy_module import lazy_module

torch = lazy_module("torch")  # loaded on first use (the launcher imports this plugin without torch)

ATTENTION_KINDS = ("unidirectional", "bidirectional")


def _check_attention(attention):
    if attention not in ATTENTION_KINDS:
        raise NotImplementedError(f"attention={attention!r} is not supported; "
                                  f"allowed: {', '.join(ATTENTION_KINDS)}")


def _check_positive(name, value, minimum=1):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


class SparsityConfig:
    """Base of every pattern: ``num_heads``, ``block`` (tile size, default 16) and
    ``different_layout_per_head``. Subclasses implement ``make_layout``."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False):
        _check_positive("num_heads", num_heads)
        _check_positive("block", block)
        self.num_heads = num_heads
        self.block = block
        self.different_layout_per_head = bool(different_layout_per_head)
        self.num_layout_heads = num_heads if self.different_layout_per_head else 1

    def setup_layout(self, seq_len):
        """An all-zero layout for ``seq_len``; ``ValueError`` when ``seq_len`` is not a
        multiple of ``block`` (pad the input with ``SparseAttentionUtils.pad_to_block_size``)."""
        if not isinstance(seq_len, int) or seq_len <= 0:
            raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
        if seq_len % self.block != 0:
            raise ValueError(f"Sequence Length, {seq_len}, needs to be dividable by Block size "
                             f"{self.block}! Pad the input with "
                             f"SparseAttentionUtils.pad_to_block_size first.")
        num_blocks = seq_len // self.block
        return torch.zeros((self.num_heads, num_blocks, num_blocks), dtype=torch.int64)

    def check_and_propagate_first_head_layout(self, layout):
        """Copy head 0's layout to every head unless each head has its own."""
        if not self.different_layout_per_head:
            layout[1:self.num_heads, :, :] = layout[0, :, :]
        return layout

    def make_layout(self, seq_len):
        raise NotImplementedError(f"{type(self).__name__} must implement make_layout(seq_len)")


class DenseSparsityConfig(SparsityConfig):
    """Every block is computed: full attention through the sparse kernels (for testing)."""

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        layout[:, :, :] = 1
        return layout


class FixedSparsityConfig(SparsityConfig):
    """The fixed pattern of "Generating Long Sequences with Sparse Transformers".

    Rows are cut into windows of ``num_local_blocks``; a block attends to its own window (to
    the earlier blocks of it when unidirectional). In each window ``num_global_blocks``
    consecutive blocks are representatives that every row attends to (only the later rows when
    unidirectional); which blocks of the window they are rotates over heads with
    ``num_different_global_patterns`` (counted from the window's end). With
    ``horizontal_global_attention`` (bidirectional only) the representatives' rows attend to
    every block too.
    """

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_local_blocks=4,
                 num_global_blocks=1, attention="bidirectional", horizontal_global_attention=False,
                 num_different_global_patterns=1):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_positive("num_local_blocks", num_local_blocks)
        _check_positive("num_global_blocks", num_global_blocks)
        if num_local_blocks % num_global_blocks != 0:
            raise ValueError(f"num_local_blocks ({num_local_blocks}) must be divisible by "
                             f"num_global_blocks ({num_global_blocks})")
        _check_attention(attention)
        if attention != "bidirectional" and horizontal_global_attention:
            raise ValueError("horizontal_global_attention is only supported with "
                             "attention='bidirectional'")
        _check_positive("num_different_global_patterns", num_different_global_patterns)
        if num_different_global_patterns > 1 and not self.different_layout_per_head:
            raise ValueError(f"num_different_global_patterns={num_different_global_patterns} "
                             f"needs different_layout_per_head=True (one pattern per head)")
        if num_different_global_patterns > num_local_blocks // num_global_blocks:
            raise ValueError(f"num_different_global_patterns={num_different_global_patterns} is "
                             f"more than the {num_local_blocks // num_global_blocks} positions a "
                             f"window of {num_local_blocks} local blocks has for "
                             f"{num_global_blocks} global block(s)")
        self.num_local_blocks = num_local_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention
        self.horizontal_global_attention = bool(horizontal_global_attention)
        self.num_different_global_patterns = num_different_global_patterns

    def set_local_layout(self, h, layout):
        num_blocks = layout.shape[1]
        for start in range(0, num_blocks, self.num_local_blocks):
            end = min(start + self.num_local_blocks, num_blocks)
            for row in range(start, end):
                last = row + 1 if self.attention == "unidirectional" else end
                layout[h, row, start:last] = 1
        return layout

    def _set_global_columns(self, h, layout, start, end):
        first_row = 0 if self.attention == "bidirectional" else start
        layout[h, first_row:, start:end] = 1
        if self.horizontal_global_attention:
            layout[h, start:end, :] = 1

    def set_global_layout(self, h, layout):
        num_blocks = layout.shape[1]
        first = self.num_local_blocks - (1 + h % self.num_different_global_patterns) * self.num_global_blocks
        full_end = num_blocks - (num_blocks % self.num_local_blocks)
        for start in range(first, full_end, self.num_local_blocks):
            self._set_global_columns(h, layout, start, start + self.num_global_blocks)
        if full_end < num_blocks:  # a last, partial window still gets its representatives
            start = min(full_end + first, num_blocks - self.num_global_blocks)
            self._set_global_columns(h, layout, start, start + self.num_global_blocks)
        return layout

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_local_layout(h, layout)
            self.set_global_layout(h, layout)
        return self.check_and_propagate_first_head_layout(layout)


def _check_global_indices(global_block_indices, global_block_end_indices):
    if not isinstance(global_block_indices, (list, tuple)) or not all(
            isinstance(i, int) and i >= 0 for i in global_block_indices):
        raise ValueError(f"global_block_indices must be a list of block indices >= 0, "
                         f"got {global_block_indices!r}")
    if global_block_end_indices is None:
        return
    if len(global_block_indices) != len(global_block_end_indices):
        raise ValueError(f"global_block_indices ({len(global_block_indices)} entries) and "
                         f"global_block_end_indices ({len(global_block_end_indices)} entries) "
                         f"must have the same length")
    for start, end in zip(global_block_indices, global_block_end_indices):
        if not isinstance(end, int) or start >= end:
            raise ValueError(f"each global block range must have start < end, got "
                             f"[{start}, {end!r})")


def set_random_layout(h, layout, num_random_blocks, rng, causal=False):
    """``num_random_blocks`` random columns per row (among the earlier ones when ``causal``)."""
    num_blocks = layout.shape[1]
    if num_blocks < num_random_blocks:
        raise ValueError(f"num_random_blocks ({num_random_blocks}) must not exceed the number "
                         f"of blocks per row ({num_blocks})")
    for row in range(num_blocks):
        pool = range(row + 1) if causal else range(num_blocks)
        cols = rng.sample(pool, min(num_random_blocks, len(pool)))
        layout[h, row, cols] = 1
    return layout


class VariableSparsityConfig(SparsityConfig):
    """Local windows of varying sizes (``local_window_blocks``; the last size repeats to the
    end), global blocks by index (or index ranges ``[start, end)`` with
    ``global_block_end_indices``) that every row attends to (later rows when unidirectional;
    their rows attend to everything with ``horizontal_global_attention``), and
    ``num_random_blocks`` random blocks per row."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_random_blocks=0,
                 local_window_blocks=(4,), global_block_indices=(0,),
                 global_block_end_indices=None, attention="bidirectional",
                 horizontal_global_attention=False, seed=None):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_positive("num_random_blocks", num_random_blocks, minimum=0)
        local_window_blocks = list(local_window_blocks)
        if not local_window_blocks or not all(isinstance(w, int) and w > 0 for w in local_window_blocks):
            raise ValueError(f"local_window_blocks must be a non-empty list of positive "
                             f"integers, got {local_window_blocks!r}")
        global_block_indices = list(global_block_indices)
        if global_block_end_indices is not None:
            global_block_end_indices = list(global_block_end_indices)
        _check_global_indices(global_block_indices, global_block_end_indices)
        _check_attention(attention)
        if attention != "bidirectional" and horizontal_global_attention:
            raise ValueError("horizontal_global_attention is only supported with "
                             "attention='bidirectional'")
        self.num_random_blocks = num_random_blocks
        self.local_window_blocks = local_window_blocks
        self.global_block_indices = global_block_indices
        self.global_block_end_indices = global_block_end_indices
        self.attention = attention
        self.horizontal_global_attention = bool(horizontal_global_attention)
        self.rng = random.Random(seed)

    def set_random_layout(self, h, layout):
        return set_random_layout(h, layout, self.num_random_blocks, self.rng)

    def _fill_window(self, h, layout, start, end):
        for row in range(start, end):
            last = row + 1 if self.attention == "unidirectional" else end
            layout[h, row, start:last] = 1

    def set_local_layout(self, h, layout):
        num_blocks = layout.shape[1]
        start = 0
        for size in self.local_window_blocks:
            self._fill_window(h, layout, start, min(start + size, num_blocks))
            start += size
        size = self.local_window_blocks[-1]
        for window in range(start, num_blocks, size):
            self._fill_window(h, layout, window, min(window + size, num_blocks))
        return layout

    def set_global_layout(self, h, layout):
        num_blocks = layout.shape[1]
        ends = self.global_block_end_indices or [i + 1 for i in self.global_block_indices]
        for start, end in zip(self.global_block_indices, ends):
            if start >= num_blocks:
                continue
            end = min(end, num_blocks)
            if self.horizontal_global_attention:
                layout[h, start:end, :] = 1
            first_row = 0 if self.attention == "bidirectional" else start
            layout[h, first_row:, start:end] = 1
        return layout

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_random_layout(h, layout)
            self.set_local_layout(h, layout)
            self.set_global_layout(h, layout)
        return self.check_and_propagate_first_head_layout(layout)
