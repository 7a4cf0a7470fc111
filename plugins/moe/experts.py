"""The experts one rank holds: ``num_local_experts`` independent deep copies of one module.

Each parameter is marked the upstream way (``allreduce = False``, ``group_name =
"ep_size_{n}"``): optimizers and checkpoint code find expert parameters by these marks
(``deepspeed.moe.utils.is_moe_param``), and the layer adds the gradient group once the
process groups exist (``deepspeed.hooks.GRADIENT_GROUP``).
"""
import copy

import torch
from torch import nn


def _copy_with_marks(expert):
    """A deep copy of ``expert`` whose parameters keep the original's Python attributes:
    ``copy.deepcopy`` of a parameter drops them, and a tensor-parallel expert's marks
    (Megatron's ``tensor_model_parallel``, ``partition_dim``, ...) say how gradients and
    checkpoints treat it."""
    clone = copy.deepcopy(expert)
    for original, copied in zip(expert.parameters(), clone.parameters()):
        for key, value in vars(original).items():
            if not hasattr(copied, key):
                setattr(copied, key, value)
    return clone


class Experts(nn.Module):

    def __init__(self, expert, num_local_experts=1, expert_group_name=None):
        super().__init__()
        self.deepspeed_experts = nn.ModuleList(
            [_copy_with_marks(expert) for _ in range(num_local_experts)])
        self.num_local_experts = num_local_experts
        for param in self.parameters():
            param.allreduce = False
            param.group_name = expert_group_name

    def forward(self, inputs):
        """``inputs`` is ``[ep, num_local_experts, C, M]``: expert ``i`` gets ``inputs[:, i]``
        (the slots every source rank filled for it) and keeps that shape.

        The expert runs once per source rank, on that rank's ``[C, M]`` slots, rather than once
        on the ``ep * C`` rows folded together: a CPU BLAS rounds the same row differently in
        the last bit depending on how many rows the product has, so folding made a token's
        output depend on the expert-parallel layout (a checkpoint saved at ep 2 gave outputs
        1.5e-8 off when loaded at ep 1). Split, every layout computes the same products. Timed
        with ``tools/bench/moe_bench.py`` (ep 2, 2 CPU ranks, alternating runs): the moe/dense
        ratio moved within the machine's noise (1.06-1.23 split, 1.08-1.22 folded).
        """
        chunks = inputs.chunk(self.num_local_experts, dim=1)
        outputs = []
        for chunk, expert in zip(chunks, self.deepspeed_experts):
            outs = []
            for part in chunk.split(1, dim=0):
                out = expert(part)
                if isinstance(out, tuple):  # Megatron MLPs return (output, bias)
                    out = out[0]
                outs.append(out)
            outputs.append(torch.cat(outs, dim=0))
        return torch.cat(outputs, dim=1)
