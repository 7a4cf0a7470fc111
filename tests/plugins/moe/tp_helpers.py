"""A tiny Megatron-style model-parallel unit and a tiny tensor-parallel expert for the MoE
tensor-parallelism tests, plus copying a single-process reference's weights into them.

Ranks are laid out the Megatron way: ``rank = dp_rank * tp + tp_rank``, tensor-parallel groups
are consecutive ranks, data-parallel groups strided (tp 2 x dp 2: TP [0, 1], [2, 3]; DP
[0, 2], [1, 3])."""
import torch
import torch.nn.functional as F
from torch import nn

from moe_helpers import HIDDEN

PREFIX = "deepspeed_moe.experts.deepspeed_experts."


class TinyMPU:
    """``get_{tensor_,}model_parallel_*`` and ``get_data_parallel_*``; collective to build
    (every rank creates every group in the same order)."""

    def __init__(self, tp):
        import deepspeed.comm as dist

        world, rank = dist.get_world_size(), dist.get_rank()
        self.tp, self.dp = tp, world // tp
        self.tp_rank, self.dp_rank = rank % tp, rank // tp
        for first in range(0, world, tp):
            ranks = list(range(first, first + tp))
            group = dist.new_group(ranks)
            if rank in ranks:
                self.tp_group = group
        for tp_rank in range(tp):
            ranks = list(range(tp_rank, world, tp))
            group = dist.new_group(ranks)
            if rank in ranks:
                self.dp_group = group

    def get_model_parallel_group(self):
        return self.tp_group

    def get_model_parallel_world_size(self):
        return self.tp

    def get_model_parallel_rank(self):
        return self.tp_rank

    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_rank = get_model_parallel_rank

    def get_data_parallel_group(self):
        return self.dp_group

    def get_data_parallel_world_size(self):
        return self.dp

    def get_data_parallel_rank(self):
        return self.dp_rank


def _tp_group():
    from deepspeed.utils import groups

    return groups._get_model_parallel_group()


class _CopyToTP(torch.autograd.Function):
    """Identity forward; the gradient summed over the tensor-parallel group (Megatron's
    ``copy_to_tensor_model_parallel_region``)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        import deepspeed.comm as dist

        grad = grad.clone()
        dist.all_reduce(grad, group=_tp_group())
        return grad


class _ReduceFromTP(torch.autograd.Function):
    """Sum over the tensor-parallel group; identity backward."""

    @staticmethod
    def forward(ctx, x):
        import deepspeed.comm as dist

        x = x.clone()
        dist.all_reduce(x, group=_tp_group())
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class TPExpert(nn.Module):
    """``Linear(h, inner) -> ReLU -> Linear(inner, h)`` split the Megatron way: the first
    column-parallel (rows of w1/b1), the second row-parallel (columns of w2; b2 whole, added
    after the reduction). Looks its group up at forward, so deep copies need no group."""

    def __init__(self, tp, hidden=HIDDEN, inner=16):
        super().__init__()
        part, self.tp = inner // tp, tp
        self.w1 = nn.Parameter(torch.zeros(part, hidden))
        self.b1 = nn.Parameter(torch.zeros(part))
        self.w2 = nn.Parameter(torch.zeros(hidden, part))
        self.b2 = nn.Parameter(torch.zeros(hidden))
        for param, dim in ((self.w1, 0), (self.b1, 0), (self.w2, 1)):
            param.tensor_model_parallel, param.partition_dim = True, dim
        self.b2.tensor_model_parallel = False

    def forward(self, x):
        if self.tp == 1:  # whole: the unsplit expert under the same names
            return F.linear(F.relu(F.linear(x, self.w1, self.b1)), self.w2, self.b2)
        h = F.relu(F.linear(_CopyToTP.apply(x), self.w1, self.b1))
        return _ReduceFromTP.apply(F.linear(h, self.w2)) + self.b2


def tp_shards(full, tp, tp_rank):
    """``{w1, b1, w2, b2}`` of ``TPExpert`` cut from a reference expert's state dict
    (``0.weight``, ``0.bias``, ``2.weight``, ``2.bias``)."""
    return {"w1": full["0.weight"].chunk(tp, 0)[tp_rank],
            "b1": full["0.bias"].chunk(tp, 0)[tp_rank],
            "w2": full["2.weight"].chunk(tp, 1)[tp_rank], "b2": full["2.bias"]}


def reference_expert_state(state, global_idx, prefix=PREFIX):
    head = f"{prefix}{global_idx}."
    return {k[len(head):]: v for k, v in state.items() if k.startswith(head)}


def load_layer(layer, reference_state, ep_rank, expert_tp, tp, tp_rank, prefix=PREFIX):
    """Give an MoE layer (state-dict keys under ``prefix``'s parent) the reference's gate and
    the experts this rank holds (``ep_rank``), cut for ``tp_rank`` when ``expert_tp``."""
    mine = {}
    for key, value in reference_state.items():
        if not key.startswith(prefix):
            mine[key] = value
    for local in range(layer.num_local_experts):
        full = reference_expert_state(reference_state, ep_rank * layer.num_local_experts + local,
                                      prefix)
        pieces = tp_shards(full, tp, tp_rank) if expert_tp else full
        for key, value in pieces.items():
            mine[f"{prefix}{local}.{key}"] = value.clone()
    layer.load_state_dict(mine)


def expert_grads_as_reference(layer, local, expert_tp, tp, tp_rank, grads):
    """The reference expert's gradients ``grads`` (by its keys) in ``layer``'s local expert's
    parameter order, cut like its pieces."""
    pieces = tp_shards(grads, tp, tp_rank) if expert_tp else grads
    expert = layer.deepspeed_moe.experts.deepspeed_experts[local]
    return [pieces[name] for name, _ in expert.named_parameters()]
