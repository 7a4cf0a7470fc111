"""partition_uniform / partition_balanced (``deepspeed.runtime.utils``): boundary lists, and the
balanced split against a brute-force optimum."""
import doctest
import itertools
import random

import pytest

import deepspeed.pipe.partitioning as partitioning
from deepspeed.runtime.utils import partition_balanced, partition_uniform


def _part_weights(weights, parts):
    return [sum(weights[parts[p]:parts[p + 1]]) for p in range(len(parts) - 1)]


def _valid(parts, num_items, num_parts):
    return (len(parts) == num_parts + 1 and parts[0] == 0 and parts[-1] == num_items
            and all(a <= b for a, b in zip(parts, parts[1:])))


def test_docstring_examples():
    assert doctest.testmod(partitioning).failed == 0


def test_uniform():
    assert partition_uniform(4, 2) == [0, 2, 4]  # api-part1 §8: 4 equal layers on 2 stages
    assert partition_uniform(10, 4) == [0, 3, 6, 8, 10]
    assert partition_uniform(7, 1) == [0, 7]
    assert partition_uniform(2, 4) == [0, 1, 2, 2, 2]
    assert partition_uniform(0, 3) == [0, 0, 0, 0]
    for n in range(0, 20):
        for m in range(1, 7):
            parts = partition_uniform(n, m)
            assert _valid(parts, n, m)
            sizes = [b - a for a, b in zip(parts, parts[1:])]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("call", [lambda: partition_uniform(4, 0), lambda: partition_uniform(-1, 2),
                                  lambda: partition_uniform(4, 1.5),
                                  lambda: partition_balanced([1, 2], 0),
                                  lambda: partition_balanced([1, -2], 2),
                                  lambda: partition_balanced([1, "2"], 2)])
def test_bad_arguments(call):
    with pytest.raises(ValueError):
        call()


def test_balanced_examples():
    assert partition_balanced([1, 1, 1, 1], 2) == [0, 2, 4]
    assert partition_balanced([4, 1, 1, 1, 1], 2) == [0, 1, 5]
    assert partition_balanced([1, 1, 1, 1, 4], 2) == [0, 4, 5]
    assert partition_balanced([5, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [0, 3, 10]
    assert partition_balanced([3], 1) == [0, 1]
    # fewer items than parts: one item each, then empty parts (as partition_uniform)
    assert partition_balanced([1, 2], 4) == [0, 1, 2, 2, 2]
    assert partition_balanced([], 2) == [0, 0, 0]
    # zero-weight items still leave every part non-empty
    parts = partition_balanced([0, 0, 0, 0], 3)
    assert _valid(parts, 4, 3) and all(b > a for a, b in zip(parts, parts[1:]))


def _brute_force_best(weights, num_parts):
    """(lightest heaviest part, then heaviest lightest part among those) over every split."""
    n = len(weights)
    best = None
    for cuts in itertools.combinations(range(1, n), num_parts - 1):
        sums = _part_weights(weights, [0, *cuts, n])
        key = (max(sums), -min(sums))
        best = key if best is None else min(best, key)
    return best[0], -best[1]


def test_balanced_then_smallest_spread():
    """Upstream's layer placement: after the heaviest part, the spread is minimised, so
    [1, 1, 1, 1, 0, 1] on 4 stages weighs 2, 1, 1, 1 (not 2, 2, 0, 1)."""
    weights = [1, 1, 1, 1, 0, 1]
    sums = _part_weights(weights, partition_balanced(weights, 4))
    assert max(sums) == 2 and max(sums) - min(sums) <= 1


def test_balanced_matches_brute_force_optimum():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 9)
        m = rng.randint(1, n)
        if rng.random() < 0.5:
            weights = [rng.randint(0, 20) for _ in range(n)]
        else:
            weights = [rng.uniform(0, 5) for _ in range(n)]
        parts = partition_balanced(weights, m)
        assert _valid(parts, n, m)
        assert all(b > a for a, b in zip(parts, parts[1:])), (weights, m, parts)
        heaviest, lightest = _brute_force_best(weights, m)
        sums = _part_weights(weights, parts)
        assert max(sums) == pytest.approx(heaviest, rel=1e-12, abs=1e-12), (weights, m, parts)
        assert min(sums) == pytest.approx(lightest, rel=1e-12, abs=1e-12), (weights, m, parts)


def test_balanced_large_input_is_fast_and_optimal_for_equal_weights():
    parts = partition_balanced([7] * 1000, 8)
    assert parts == partition_uniform(1000, 8)
