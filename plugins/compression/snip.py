"""``snip_momentum`` sparse pruning: structured masks from momentum-averaged SNIP scores.

A weight's SNIP score is ``|w · ∂L/∂w|`` (the loss change if it were removed), averaged over
training forwards with momentum ``SCORE_MOMENTUM``. Every ``schedule_offset_stride`` steps from
``schedule_offset`` to ``schedule_offset_end`` the mask is recomputed from the scores of whole
blocks, the kept fraction falling linearly from 1 to ``dense_ratio`` (reached at
``schedule_offset_end``). ``block_pattern`` ``"NxM"`` prunes blocks of N rows × M columns of the
(out, in) weight; ``"N:M"`` keeps the N best of every M consecutive weights of a row (then the
density is N/M and ``dense_ratio`` does not apply). Upstream delegates this to Intel
neural_compressor; the ratio here is per layer, so every layer ends at the global ratio.
"""
import re

import torch

from .masks import kept_count

SCORE_MOMENTUM = 0.9
_BLOCK = re.compile(r"^(\d+)x(\d+)$")
_N_M = re.compile(r"^(\d+):(\d+)$")


def check_block_pattern(pattern):
    """The parsed pattern ``("block", n, m)`` or ``("n:m", n, m)``; ValueError otherwise."""
    for kind, regex in (("block", _BLOCK), ("n:m", _N_M)):
        match = regex.match(pattern)
        if match:
            n, m = int(match.group(1)), int(match.group(2))
            if n < 1 or m < 1 or (kind == "n:m" and n > m):
                break
            return kind, n, m
    raise ValueError(f"block_pattern must be 'NxM' (blocks of N rows x M columns) or 'N:M' "
                     f"(N kept of every M), with N, M >= 1 (and N <= M for N:M); got "
                     f"{pattern!r}")


def target_ratio(step, cfg):
    """The kept fraction the schedule asks for at ``step``, or None when ``step`` is no pruning
    step (before the offset, after the end, or between strides)."""
    start, end, stride = cfg["schedule_offset"], cfg["schedule_offset_end"], cfg["stride"]
    if end <= start:  # one-shot at the offset
        return cfg["dense_ratio"] if step == start else None
    if step < start or step > end or (step != end and (step - start) % stride):
        return None
    return 1.0 - (1.0 - cfg["dense_ratio"]) * (step - start) / (end - start)


def block_mask(scores, pattern, ratio, where):
    """A 0/1 mask shaped like ``scores`` (a 2-D weight's) from its block pattern."""
    kind, n, m = check_block_pattern(pattern)
    rows, cols = scores.shape[0], scores.reshape(scores.shape[0], -1).shape[1]
    flat = scores.reshape(rows, cols).float()
    if kind == "n:m":
        if cols % m:
            raise ValueError(f"{where}: block_pattern {pattern!r} needs the input size ({cols}) "
                             f"to be a multiple of {m}")
        groups = flat.reshape(rows, cols // m, m)
        keep = torch.zeros_like(groups)
        keep.scatter_(2, groups.topk(n, dim=2).indices, 1.0)
        return keep.reshape(scores.shape)
    if rows % n or cols % m:
        raise ValueError(f"{where}: block_pattern {pattern!r} does not tile a {rows}x{cols} "
                         f"weight")
    blocks = flat.reshape(rows // n, n, cols // m, m).sum(dim=(1, 3))
    keep = torch.zeros(blocks.numel())
    keep[blocks.reshape(-1).topk(kept_count(blocks.numel(), ratio)).indices] = 1.0
    keep = keep.reshape(blocks.shape).repeat_interleave(n, 0).repeat_interleave(m, 1)
    return keep.reshape(scores.shape).to(scores.device)
