"""Every pattern's layout equals a reference built here from the documented rules, written as
per-block predicates (row i attends to column j when ...) rather than the configs' loops."""
import pytest
import torch

from deepspeed.sparse_attention import (BigBirdSparsityConfig, BSLongformerSparsityConfig,
                                        DenseSparsityConfig, FixedSparsityConfig,
                                        LocalSlidingWindowSparsityConfig, SparsityConfig,
                                        VariableSparsityConfig)

BLOCK = 16


def _grid(n):
    i = torch.arange(n)[:, None].expand(n, n)
    j = torch.arange(n)[None, :].expand(n, n)
    return i, j


def fixed_reference(n, h, local, glob, attention, horizontal, patterns):
    i, j = _grid(n)
    causal = attention == "unidirectional"
    ref = (i // local == j // local) & ((j <= i) if causal else torch.ones_like(i, dtype=torch.bool))
    offset = local - (1 + h % patterns) * glob  # representatives' first block in each window
    starts = [w * local + offset for w in range(n // local)]
    if n % local:
        starts.append(min((n // local) * local + offset, n - glob))
    for s in starts:
        in_group_col = (j >= s) & (j < s + glob)
        ref |= in_group_col & ((i >= s) if causal else True)
        if horizontal:
            ref |= (i >= s) & (i < s + glob)
    return ref.long()


@pytest.mark.parametrize("blocks", [4, 7, 12, 16])
@pytest.mark.parametrize("local,glob", [(4, 1), (4, 2), (3, 1)])
@pytest.mark.parametrize("attention,horizontal", [("bidirectional", False),
                                                  ("bidirectional", True),
                                                  ("unidirectional", False)])
def test_fixed(blocks, local, glob, attention, horizontal):
    cfg = FixedSparsityConfig(2, block=BLOCK, num_local_blocks=local, num_global_blocks=glob,
                              attention=attention, horizontal_global_attention=horizontal)
    layout = cfg.make_layout(blocks * BLOCK)
    assert layout.shape == (2, blocks, blocks)
    want = fixed_reference(blocks, 0, local, glob, attention, horizontal, 1)
    assert torch.equal(layout[0], want) and torch.equal(layout[1], want)


def test_fixed_per_head_global_patterns_rotate():
    cfg = FixedSparsityConfig(4, block=BLOCK, different_layout_per_head=True, num_local_blocks=4,
                              num_global_blocks=1, num_different_global_patterns=4)
    layout = cfg.make_layout(16 * BLOCK)
    for h in range(4):
        assert torch.equal(layout[h], fixed_reference(16, h, 4, 1, "bidirectional", False, 4))
    assert len({tuple(layout[h].flatten().tolist()) for h in range(4)}) == 4


def test_fixed_by_hand_4x4():
    """seq 64 / block 16, 2 local blocks, 1 global, unidirectional: computed on paper."""
    cfg = FixedSparsityConfig(1, block=16, num_local_blocks=2, num_global_blocks=1,
                              attention="unidirectional")
    assert cfg.make_layout(64)[0].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1]]


def window_reference(n, window, causal):
    i, j = _grid(n)
    near = (j >= i - window // 2) & (j <= i + window // 2)
    return near & (j <= i) if causal else near


@pytest.mark.parametrize("blocks", [5, 9, 16])
@pytest.mark.parametrize("window", [1, 3, 5])
@pytest.mark.parametrize("attention", ["bidirectional", "unidirectional"])
def test_local_sliding_window(blocks, window, attention):
    layout = LocalSlidingWindowSparsityConfig(3, block=BLOCK, num_sliding_window_blocks=window,
                                              attention=attention).make_layout(blocks * BLOCK)
    want = window_reference(blocks, window, attention == "unidirectional").long()
    assert all(torch.equal(layout[h], want) for h in range(3))


@pytest.mark.parametrize("blocks", [6, 12])
@pytest.mark.parametrize("globals_,ends", [([0], None), ([0, 5], None), ([1, 4], [3, 6])])
@pytest.mark.parametrize("attention", ["bidirectional", "unidirectional"])
def test_bslongformer(blocks, globals_, ends, attention):
    cfg = BSLongformerSparsityConfig(2, block=BLOCK, num_sliding_window_blocks=3,
                                     global_block_indices=globals_, global_block_end_indices=ends,
                                     attention=attention)
    layout = cfg.make_layout(blocks * BLOCK)
    i, j = _grid(blocks)
    want = window_reference(blocks, 3, False)
    for s, e in zip(globals_, ends or [g + 1 for g in globals_]):
        want |= ((i >= s) & (i < e)) | ((j >= s) & (j < e))
    if attention == "unidirectional":
        want &= j <= i
    assert torch.equal(layout[0], want.long()) and torch.equal(layout[1], want.long())


def bigbird_deterministic(n, window, glob, causal):
    i, j = _grid(n)
    want = window_reference(n, window, False) | (i < glob) | (j < glob)
    return want & (j <= i) if causal else want


@pytest.mark.parametrize("blocks", [8, 16])
@pytest.mark.parametrize("attention", ["bidirectional", "unidirectional"])
def test_bigbird(blocks, attention):
    causal = attention == "unidirectional"
    plain = BigBirdSparsityConfig(2, block=BLOCK, num_random_blocks=0, num_sliding_window_blocks=3,
                                  num_global_blocks=2, attention=attention).make_layout(blocks * BLOCK)
    det = bigbird_deterministic(blocks, 3, 2, causal)
    assert torch.equal(plain[0], det.long()) and torch.equal(plain[1], det.long())
    rnd = BigBirdSparsityConfig(4, block=BLOCK, different_layout_per_head=True, num_random_blocks=2,
                                num_sliding_window_blocks=3, num_global_blocks=1,
                                attention=attention, seed=3).make_layout(blocks * BLOCK)
    det = bigbird_deterministic(blocks, 3, 1, causal)
    for h in range(4):
        extra = rnd[h].bool() & ~det
        assert (rnd[h].bool() | ~det).all(), "the window and global blocks are always there"
        assert (extra.sum(-1) <= 2).all(), "at most num_random_blocks more per row"
        if causal:
            assert not extra.triu(1).any(), "random blocks of a causal pattern look back only"
    assert len({tuple(rnd[h].flatten().tolist()) for h in range(4)}) > 1, "heads differ"


def variable_reference(n, windows, globals_, ends, attention, horizontal):
    i, j = _grid(n)
    bounds, start, k = [], 0, 0
    while start < n:
        size = windows[min(k, len(windows) - 1)]
        bounds.append((start, min(start + size, n)))
        start, k = start + size, k + 1
    want = torch.zeros(n, n, dtype=torch.bool)
    for s, e in bounds:
        inside = (i >= s) & (i < e) & (j >= s) & (j < e)
        want |= inside & (j <= i) if attention == "unidirectional" else inside
    for s, e in zip(globals_, ends or [g + 1 for g in globals_]):
        if s >= n:
            continue
        col = (j >= s) & (j < e)
        want |= col & (i >= s) if attention == "unidirectional" else col
        if horizontal:
            want |= (i >= s) & (i < e)
    return want.long()


@pytest.mark.parametrize("blocks", [5, 12])
@pytest.mark.parametrize("windows", [[4], [2, 3], [1, 2, 4]])
@pytest.mark.parametrize("globals_,ends", [([0], None), ([0, 7], None), ([2], [4])])
@pytest.mark.parametrize("attention,horizontal", [("bidirectional", False), ("bidirectional", True),
                                                  ("unidirectional", False)])
def test_variable(blocks, windows, globals_, ends, attention, horizontal):
    cfg = VariableSparsityConfig(2, block=BLOCK, local_window_blocks=windows,
                                 global_block_indices=globals_, global_block_end_indices=ends,
                                 attention=attention, horizontal_global_attention=horizontal)
    layout = cfg.make_layout(blocks * BLOCK)
    want = variable_reference(blocks, windows, globals_, ends, attention, horizontal)
    assert torch.equal(layout[0], want) and torch.equal(layout[1], want)


def test_variable_random_blocks_per_head():
    cfg = VariableSparsityConfig(4, block=BLOCK, different_layout_per_head=True, num_random_blocks=2,
                                 seed=0)
    layout = cfg.make_layout(16 * BLOCK)
    det = variable_reference(16, [4], [0], None, "bidirectional", False).bool()
    assert all((layout[h].bool() | ~det).all() for h in range(4))
    assert len({tuple(layout[h].flatten().tolist()) for h in range(4)}) > 1


def test_dense_and_base():
    assert DenseSparsityConfig(3, block=32).make_layout(128).eq(1).all()
    with pytest.raises(NotImplementedError, match="make_layout"):
        SparsityConfig(2).make_layout(64)


@pytest.mark.parametrize("cfg", [DenseSparsityConfig(2), FixedSparsityConfig(2),
                                 BigBirdSparsityConfig(2), BSLongformerSparsityConfig(2),
                                 VariableSparsityConfig(2), LocalSlidingWindowSparsityConfig(2)])
def test_sequence_not_a_multiple_of_the_block(cfg):
    with pytest.raises(ValueError, match="dividable by Block size 16.*pad_to_block_size"):
        cfg.make_layout(70)


@pytest.mark.parametrize("make,match", [
    (lambda: FixedSparsityConfig(2, num_local_blocks=4, num_global_blocks=3), "divisible"),
    (lambda: FixedSparsityConfig(2, attention="sideways"), "allowed: unidirectional, bidirectional"),
    (lambda: FixedSparsityConfig(2, attention="unidirectional", horizontal_global_attention=True),
     "horizontal_global_attention"),
    (lambda: FixedSparsityConfig(2, num_different_global_patterns=2), "different_layout_per_head"),
    (lambda: FixedSparsityConfig(2, different_layout_per_head=True, num_different_global_patterns=5),
     "more than the 4 positions"),
    (lambda: VariableSparsityConfig(2, global_block_indices=[0, 2], global_block_end_indices=[1]),
     "same length"),
    (lambda: VariableSparsityConfig(2, global_block_indices=[3], global_block_end_indices=[3]),
     "start < end"),
    (lambda: BigBirdSparsityConfig(2, num_random_blocks=5).make_layout(64), "num_random_blocks"),
    (lambda: BSLongformerSparsityConfig(2, num_sliding_window_blocks=9).make_layout(64),
     "num_sliding_window_blocks"),
    (lambda: SparsityConfig(0), "num_heads"),
])
def test_bad_arguments(make, match):
    with pytest.raises((ValueError, NotImplementedError), match=match):
        make()
