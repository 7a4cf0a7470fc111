"""Split a sequence of items into contiguous parts: the arithmetic behind pipeline stage
boundaries, kept free of any model knowledge so it can be tested on plain numbers.

Both functions answer with *boundaries*: a list ``parts`` of length ``num_parts + 1`` where part
``p`` holds items ``parts[p]:parts[p + 1]``; ``parts[0] == 0`` and ``parts[-1] == num_items``.
Upstream exposes them as ``deepspeed.runtime.utils.partition_uniform`` / ``partition_balanced``
(this plugin exports them there: the entry-point group ``deepspeed.exports.runtime.utils``).
"""
import numbers
from typing import List, Sequence

from deepspeed.utils.arg_checks import check_int


def partition_uniform(num_items: int, num_parts: int) -> List[int]:
    """Boundaries that give every part ``num_items // num_parts`` items, the first
    ``num_items % num_parts`` parts one more.

    With fewer items than parts, the first ``num_items`` parts get one item each and the rest are
    empty, so the result is still a valid ``num_parts + 1`` boundary list.

    >>> partition_uniform(4, 2)
    [0, 2, 4]
    >>> partition_uniform(10, 4)
    [0, 3, 6, 8, 10]
    """
    num_items = check_int("num_items", num_items, 0)
    num_parts = check_int("num_parts", num_parts, 1)
    chunk, extra = divmod(num_items, num_parts)
    parts = [0]
    for p in range(num_parts):
        parts.append(parts[-1] + chunk + (1 if p < extra else 0))
    return parts


def _check_weights(weights) -> List[float]:
    checked = []
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or w != w or w < 0:
            raise ValueError(f"partition_balanced weights must be non-negative numbers, "
                             f"got weights[{i}]={w!r}")
        checked.append(w)
    return checked


def _min_bottleneck(prefix: Sequence[float], num_parts: int) -> float:
    """The smallest achievable maximum part weight over ``num_parts`` non-empty contiguous parts.

    ``best[j][i]`` = optimum for the first ``i`` items in ``j`` parts. ``best[j-1][k]`` grows with
    ``k`` while the weight of the last part (items ``k:i``) shrinks, so the minimum of their max
    sits where the two curves cross: a binary search per ``i`` (O(parts * n log n)) instead of
    scanning every ``k``. Exact for float weights, unlike a search over the answer's value.
    """
    n = len(prefix) - 1
    best = list(prefix)  # one part: everything so far
    for j in range(2, num_parts + 1):
        nxt = [float("inf")] * (n + 1)
        for i in range(j, n + 1):
            lo, hi = j - 1, i - 1  # k = first item of the last part; parts before stay non-empty
            # smallest k in [lo, hi] with best[k] >= weight(k:i)
            a, b = lo, hi + 1
            while a < b:
                mid = (a + b) // 2
                if best[mid] >= prefix[i] - prefix[mid]:
                    b = mid
                else:
                    a = mid + 1
            candidates = [k for k in (a - 1, a) if lo <= k <= hi]
            nxt[i] = min(max(best[k], prefix[i] - prefix[k]) for k in candidates)
        best = nxt
    return best[n]


def _furthest_end(prefix, start, bound):
    """The largest ``end`` with ``prefix[end] - prefix[start] <= bound`` (``start`` if none)."""
    a, b = start, len(prefix) - 1
    while a < b:
        mid = (a + b + 1) // 2
        if prefix[mid] - prefix[start] <= bound:
            a = mid
        else:
            b = mid - 1
    return a


def _reach_bounds(prefix, lower, upper):
    """For each start ``i``: the range ``[lo, hi]`` of ends ``e > i`` whose part ``i:e`` weighs
    within ``[lower, upper]`` (empty when ``lo > hi``). Weights are non-negative, so the part
    weight grows with ``e`` and both ends are binary searches; the weight is always taken as the
    same prefix difference, so float rounding agrees with the optimum's."""
    n = len(prefix) - 1
    bounds = []
    for i in range(n):
        a, b = i + 1, n + 1  # smallest e > i with weight(i:e) >= lower
        while a < b:
            mid = (a + b) // 2
            if prefix[mid] - prefix[i] >= lower:
                b = mid
            else:
                a = mid + 1
        bounds.append((a, _furthest_end(prefix, i, upper)))
    return bounds


def _can_finish(prefix, num_parts, lower, upper):
    """``can[r][i]``: items ``i:`` split into ``r`` non-empty parts each weighing within
    ``[lower, upper]``. One pass per part count over a running sum of the previous row, so a
    check costs O(n log n + parts * n)."""
    n = len(prefix) - 1
    bounds = _reach_bounds(prefix, lower, upper)
    can = [[False] * (n + 1) for _ in range(num_parts + 1)]
    can[0][n] = True
    for r in range(1, num_parts + 1):
        previous = can[r - 1]
        running = [0] * (n + 2)  # running[e] = how many ends in [0, e) finish r - 1 parts
        for e in range(n + 1):
            running[e + 1] = running[e] + previous[e]
        row = can[r]
        for i, (lo, hi) in enumerate(bounds):
            row[i] = lo <= hi and running[hi + 1] > running[lo]
    return can


def _best_lightest_part(weights, prefix, num_parts, upper):
    """The largest ``lower`` such that ``num_parts`` parts can each weigh within
    ``[lower, upper]``: a binary search over the integers for integer weights, else over the
    part weights that can occur (the answer is one of them)."""
    feasible = lambda lower: _can_finish(prefix, num_parts, lower, upper)[num_parts][0]  # noqa: E731
    if all(float(w).is_integer() for w in weights):
        a, b = 0, int(upper)
        while a < b:
            mid = (a + b + 1) // 2
            a, b = (mid, b) if feasible(mid) else (a, mid - 1)
        return a
    n = len(prefix) - 1
    candidates = sorted({prefix[e] - prefix[i] for i in range(n) for e in range(i + 1, n + 1)
                         if prefix[e] - prefix[i] <= upper})
    a, b = 0, len(candidates) - 1  # candidates[0] (the lightest single item) is always feasible
    while a < b:
        mid = (a + b + 1) // 2
        a, b = (mid, b) if feasible(candidates[mid]) else (a, mid - 1)
    return candidates[a]


def partition_balanced(weights: Sequence[float], num_parts: int) -> List[int]:
    """Boundaries of ``num_parts`` contiguous parts whose heaviest part is as light as possible,
    and among those, whose lightest part is as heavy as possible (the smallest spread).

    ``weights[i]`` is the cost of item ``i`` (a layer's parameter count, say). Both optima are
    computed exactly: first the heaviest part's weight, then the lightest part's given it (so
    ``[1, 1, 1, 1, 0, 1]`` on 4 parts gives part weights 2, 1, 1, 1, not 2, 2, 0, 1). Among the
    partitions reaching both, the one that fills parts from the front (each part takes as many
    items as it can while the rest can still be split within both bounds) is returned, so the
    answer is deterministic. With at least as many items as parts every part is non-empty; with
    fewer, this is ``partition_uniform(len(weights), num_parts)``.

    >>> partition_balanced([1, 1, 1, 1], 2)
    [0, 2, 4]
    >>> partition_balanced([4, 1, 1, 1, 1], 2)
    [0, 1, 5]
    >>> partition_balanced([1, 1, 1, 1, 0, 1], 4)
    [0, 2, 3, 5, 6]
    """
    weights = _check_weights(weights)
    num_parts = check_int("num_parts", num_parts, 1)
    n = len(weights)
    if n <= num_parts:
        return partition_uniform(n, num_parts)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    upper = _min_bottleneck(prefix, num_parts)
    lower = _best_lightest_part(weights, prefix, num_parts, upper)
    can = _can_finish(prefix, num_parts, lower, upper)
    bounds = _reach_bounds(prefix, lower, upper)

    parts = [0]
    for p in range(num_parts - 1):
        lo, hi = bounds[parts[-1]]
        rest = num_parts - 1 - p
        parts.append(next(e for e in range(hi, lo - 1, -1) if can[rest][e]))
    parts.append(n)
    return parts


__all__ = ["partition_uniform", "partition_balanced"]
