"""The experts one rank holds: ``num_local_experts`` independent deep copies of one module.

Each parameter is marked the upstream way (``allreduce = False``, ``group_name =
"ep_size_{n}"``): optimizers and checkpoint code find expert parameters by these marks
(``deepspeed.moe.utils.is_moe_param``), and the layer adds the gradient group once the
process groups exist (``deepspeed.hooks.GRADIENT_GROUP``).
"""
import copy

import torch
from torch import nn


class Experts(nn.Module):

    def __init__(self, expert, num_local_experts=1, expert_group_name=None):
        super().__init__()
        self.deepspeed_experts = nn.ModuleList(
            [copy.deepcopy(expert) for _ in range(num_local_experts)])
        self.num_local_experts = num_local_experts
        for param in self.parameters():
            param.allreduce = False
            param.group_name = expert_group_name

    def forward(self, inputs):
        """``inputs`` is ``[ep, num_local_experts, C, M]``: expert ``i`` gets ``inputs[:, i]``
        (the slots every source rank filled for it) and keeps that shape."""
        chunks = inputs.chunk(self.num_local_experts, dim=1)
        outputs = []
        for chunk, expert in zip(chunks, self.deepspeed_experts):
            out = expert(chunk)
            if isinstance(out, tuple):  # Megatron MLPs return (output, bias)
                out = out[0]
            outputs.append(out)
        return torch.cat(outputs, dim=1)
