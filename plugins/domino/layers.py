"""Domino's two tensor-parallel Linears (upstream's names), built on the tensor-parallel
plugin's ``ColumnParallelLinear`` / ``RowParallelLinear`` (same weight slices, same
``tensor_model_parallel`` / ``partition_dim`` marks), with their communication moved out of
the blocking path:

- ``DominoAsyncColumnParallelLinear``: forward as the column-parallel Linear; its backward
  launches the all-reduce of the input gradient ("f") asynchronously and computes the weight
  and bias gradients while it travels (Megatron's async tensor-parallel all-reduce).
- ``RowParallelLinearNoComm``: only this rank's partial product ``x_slice @ weight.T``; the
  caller all-reduces it asynchronously (``overlap.PendingAllReduce``) and adds ``bias`` after
  the sum, so the all-reduce can overlap the other half of the batch.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from deepspeed import comm as dist
from deepspeed.domino.overlap import launch_all_reduce, traced_compute, wait_all_reduce
from deepspeed.tensor_parallel import ColumnParallelLinear, RowParallelLinear


class _AsyncGradColumnLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, group, label, async_op):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.label, ctx.async_op, ctx.has_bias = group, label, async_op, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_input = grad.matmul(weight)
        label = f"backward {ctx.label}"
        work = launch_all_reduce(grad_input, ctx.group, label, ctx.async_op)
        with traced_compute(f"weight grad {ctx.label}"):
            flat_grad = grad.reshape(-1, grad.shape[-1])
            grad_weight = flat_grad.t().matmul(x.reshape(-1, x.shape[-1]))
            grad_bias = flat_grad.sum(0) if ctx.has_bias else None
        wait_all_reduce(work, label)
        return grad_input, grad_weight, grad_bias, None, None, None


def _init_full(out_features, in_features, bias, init_method):
    """The unsplit weight (and zero bias), initialised alike on every rank of the group from
    the shared RNG state (Megatron's CPU initialisation), so the slices fit together."""
    weight = torch.empty(out_features, in_features)
    if init_method is None:
        nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    else:
        init_method(weight)
    return weight, (torch.zeros(out_features) if bias else None)


def _slice(tensor, dim, group):
    if tensor is None:
        return None
    size, rank = dist.get_world_size(group=group), dist.get_rank(group=group)
    if tensor.shape[dim] % size:
        raise ValueError(f"dimension {dim} of size {tensor.shape[dim]} does not split evenly over "
                         f"the {size} tensor-parallel ranks")
    return nn.Parameter(tensor.chunk(size, dim)[rank].clone())


class DominoAsyncColumnParallelLinear(ColumnParallelLinear):
    """``x @ weight.T + bias`` with this rank's ``[output_size / tp, input_size]`` slice; the
    input-gradient all-reduce runs while the weight gradient is computed. ``overlap=False``
    waits for it at once (the same arithmetic, blocking: the non-overlapped reference)."""

    def __init__(self, input_size, output_size, tp_group, bias=True, init_method=None,
                 overlap=True):
        weight, full_bias = _init_full(output_size, input_size, bias, init_method)
        super().__init__(_slice(weight, 0, tp_group), _slice(full_bias, 0, tp_group), tp_group)
        self.overlap = overlap
        self.label = "column"

    def forward(self, input):
        return _AsyncGradColumnLinear.apply(input, self.weight, self.bias, self.group,
                                            self.label, self.overlap)


class RowParallelLinearNoComm(RowParallelLinear):
    """This rank's partial product ``x_slice @ weight.T`` (``[output_size, input_size / tp]``
    slice) and nothing else: no all-reduce, no bias. The whole ``bias`` is added by the
    caller after the (asynchronous) sum, exactly once."""

    def __init__(self, input_size, output_size, tp_group, bias=True, init_method=None):
        weight, full_bias = _init_full(output_size, input_size, bias, init_method)
        super().__init__(_slice(weight, 1, tp_group),
                         None if full_bias is None else nn.Parameter(full_bias), tp_group)

    def forward(self, input):
        return F.linear(input, self.weight)

    def partial_pieces(self, input, pieces):
        """The partial product in ``pieces`` slices of the output features, one at a time (a
        generator), so the caller can launch each slice's all-reduce before computing the
        next: every output element is the same dot product as in ``forward``."""
        for rows in torch.tensor_split(self.weight, pieces, dim=0):
            yield F.linear(input, rows)
