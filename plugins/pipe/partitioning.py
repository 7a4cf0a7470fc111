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


def partition_balanced(weights: Sequence[float], num_parts: int) -> List[int]:
    """Boundaries of ``num_parts`` contiguous parts whose heaviest part is as light as possible.

    ``weights[i]`` is the cost of item ``i`` (a layer's parameter count, say). The optimum of the
    maximum part weight is computed exactly; among the partitions reaching it, the one that fills
    parts from the front (each part takes as many items as fit, leaving one item for every later
    part) is returned, so the answer is deterministic. With at least as many items as parts every
    part is non-empty; with fewer, this is ``partition_uniform(len(weights), num_parts)``.

    >>> partition_balanced([1, 1, 1, 1], 2)
    [0, 2, 4]
    >>> partition_balanced([4, 1, 1, 1, 1], 2)
    [0, 1, 5]
    """
    weights = _check_weights(weights)
    num_parts = check_int("num_parts", num_parts, 1)
    n = len(weights)
    if n <= num_parts:
        return partition_uniform(n, num_parts)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    bound = _min_bottleneck(prefix, num_parts)

    parts = [0]
    for p in range(num_parts - 1):
        start = parts[-1]
        # the furthest end whose part weight stays within the bound (compared as the same
        # prefix difference the optimum was computed from, so float rounding cannot disagree) ...
        end = _furthest_end(prefix, start, bound)
        # ... leaving one item for each of the parts still to fill
        end = max(start + 1, min(end, n - (num_parts - 1 - p)))
        parts.append(end)
    parts.append(n)
    return parts


__all__ = ["partition_uniform", "partition_balanced"]
