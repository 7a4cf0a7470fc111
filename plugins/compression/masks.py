"""Pruning masks: which weights, rows, heads or channels stay.

Every function returns a 0/1 float mask that keeps exactly ``round(dense_ratio · n)`` of the
``n`` candidates (at least one), chosen by score: |w| for ``l1``, learnable scores for ``topk``.
Ties are broken by position so that the count is exact. ``TopKMask`` is the straight-through
estimator that lets ``topk`` scores learn: the forward pass uses the hard mask, the backward pass
hands the gradient to the scores unchanged.
"""
import torch


def kept_count(total, dense_ratio):
    return max(1, min(total, int(round(dense_ratio * total))))


def topk_mask(scores, dense_ratio):
    """A mask the shape of ``scores`` keeping the ``dense_ratio`` largest entries."""
    flat = scores.detach().reshape(-1)
    keep = kept_count(flat.numel(), dense_ratio)
    mask = torch.zeros_like(flat, dtype=torch.float32)
    mask[torch.topk(flat.float(), keep, sorted=False).indices] = 1.0
    return mask.reshape(scores.shape)


class TopKMask(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, dense_ratio):
        return topk_mask(scores, dense_ratio).to(scores.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def row_scores(weight):
    """L1 norm of each output row (dim 0) of a Linear weight or each filter of a Conv2d."""
    return weight.detach().abs().reshape(weight.shape[0], -1).sum(dim=1)


def head_scores(weight, num_heads):
    """L1 norm of each head's block of input columns of an attention output projection."""
    in_features = weight.shape[1]
    if in_features % num_heads:
        raise ValueError(f"head_pruning.shared_parameters.num_heads={num_heads} does not divide "
                         f"the attention output's {in_features} input features")
    return weight.detach().abs().reshape(weight.shape[0], num_heads, -1).sum(dim=(0, 2))


def expand_heads(head_mask, in_features):
    """(num_heads,) mask -> (in_features,) column mask."""
    return head_mask.repeat_interleave(in_features // head_mask.numel())
