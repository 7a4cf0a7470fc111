"""Sliding-window patterns: BigBird, BSLongformer and the plain local sliding window.

Each row attends to a window of ``num_sliding_window_blocks`` blocks centred on itself (the
blocks up to itself for the unidirectional sliding window), plus pattern-specific blocks:
random and leading global blocks (BigBird), global blocks by index or range (BSLongformer).
Global blocks work both ways: their rows attend to every block and every row attends to them;
``attention='unidirectional'`` then keeps the lower triangle only.
"""
import random

from deepspeed.sparse_attention.sparsity_config import (SparsityConfig, _check_attention,
                                                        _check_global_indices, _check_positive,
                                                        set_random_layout)
from deepspeed.utils.lazy_module import lazy_module

torch = lazy_module("torch")  # loaded on first use (the launcher imports this plugin without torch)


def _sliding_window(h, layout, window_blocks, causal):
    num_blocks = layout.shape[1]
    if num_blocks < window_blocks:
        raise ValueError(f"num_sliding_window_blocks ({window_blocks}) must not exceed the "
                         f"number of blocks per row ({num_blocks})")
    half = window_blocks // 2
    for row in range(num_blocks):
        start = max(0, row - half)
        end = row + 1 if causal else min(row + half + 1, num_blocks)
        layout[h, row, start:end] = 1
    return layout


class BigBirdSparsityConfig(SparsityConfig):
    """BigBird ("Big Bird: Transformers for Longer Sequences"): ``num_random_blocks`` random
    blocks per row, a sliding window of ``num_sliding_window_blocks`` and the first
    ``num_global_blocks`` blocks as global rows and columns."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_random_blocks=1,
                 num_sliding_window_blocks=3, num_global_blocks=1, attention="bidirectional",
                 seed=None):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_positive("num_random_blocks", num_random_blocks, minimum=0)
        _check_positive("num_sliding_window_blocks", num_sliding_window_blocks)
        _check_positive("num_global_blocks", num_global_blocks)
        _check_attention(attention)
        self.num_random_blocks = num_random_blocks
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention
        self.rng = random.Random(seed)

    def set_random_layout(self, h, layout):
        return set_random_layout(h, layout, self.num_random_blocks, self.rng,
                                 causal=self.attention == "unidirectional")

    def set_sliding_window_layout(self, h, layout):
        return _sliding_window(h, layout, self.num_sliding_window_blocks, causal=False)

    def set_global_layout_itc(self, h, layout):
        num_blocks = layout.shape[1]
        if num_blocks < self.num_global_blocks:
            raise ValueError(f"num_global_blocks ({self.num_global_blocks}) must not exceed the "
                             f"number of blocks per row ({num_blocks})")
        layout[h, :self.num_global_blocks, :] = 1
        layout[h, :, :self.num_global_blocks] = 1
        if self.attention == "unidirectional":
            layout[h] = torch.tril(layout[h])
        return layout

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_random_layout(h, layout)
            self.set_sliding_window_layout(h, layout)
            self.set_global_layout_itc(h, layout)
        return self.check_and_propagate_first_head_layout(layout)


class BSLongformerSparsityConfig(SparsityConfig):
    """Block-sparse Longformer: a sliding window of ``num_sliding_window_blocks`` plus global
    blocks at ``global_block_indices`` (or the ranges ``[start, end)`` with
    ``global_block_end_indices``)."""

    def __init__(self, num_heads, block=16, different_layout_per_head=False,
                 num_sliding_window_blocks=3, global_block_indices=(0,),
                 global_block_end_indices=None, attention="bidirectional"):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_positive("num_sliding_window_blocks", num_sliding_window_blocks)
        global_block_indices = list(global_block_indices)
        if global_block_end_indices is not None:
            global_block_end_indices = list(global_block_end_indices)
        _check_global_indices(global_block_indices, global_block_end_indices)
        _check_attention(attention)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.global_block_indices = global_block_indices
        self.global_block_end_indices = global_block_end_indices
        self.attention = attention

    def set_sliding_window_layout(self, h, layout):
        return _sliding_window(h, layout, self.num_sliding_window_blocks, causal=False)

    def set_global_layout(self, h, layout):
        num_blocks = layout.shape[1]
        ends = self.global_block_end_indices or [i + 1 for i in self.global_block_indices]
        for start, end in zip(self.global_block_indices, ends):
            if start < num_blocks:
                end = min(end, num_blocks)
                layout[h, start:end, :] = 1
                layout[h, :, start:end] = 1
        if self.attention == "unidirectional":
            layout[h] = torch.tril(layout[h])
        return layout

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_sliding_window_layout(h, layout)
            self.set_global_layout(h, layout)
        return self.check_and_propagate_first_head_layout(layout)


class LocalSlidingWindowSparsityConfig(SparsityConfig):
    """Only a sliding window: ``num_sliding_window_blocks`` centred on each row
    (bidirectional), or the row and the ``num_sliding_window_blocks // 2`` before it
    (unidirectional, the default)."""

    def __init__(self, num_heads, block=16, num_sliding_window_blocks=3, attention="unidirectional"):
        super().__init__(num_heads, block)
        _check_positive("num_sliding_window_blocks", num_sliding_window_blocks)
        _check_attention(attention)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.attention = attention

    def set_sliding_window_layout(self, h, layout):
        return _sliding_window(h, layout, self.num_sliding_window_blocks,
                               causal=self.attention == "unidirectional")

    def make_layout(self, seq_len):
        layout = self.setup_layout(seq_len)
        for h in range(self.num_layout_heads):
            self.set_sliding_window_layout(h, layout)
        return self.check_and_propagate_first_head_layout(layout)
