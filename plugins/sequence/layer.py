"""DeepSpeed-Ulysses attention for client models (`deepspeed.sequence.layer`).

Each rank holds a slice of the sequence for all heads. Attention needs the whole sequence, but
heads are independent, so one all-to-all turns "sequence slice x all heads" into "whole sequence
x heads/p", the unchanged local attention runs, and the inverse all-to-all restores the layout.
"""
import torch

from deepspeed.sequence.all_to_all import seq_all_to_all


class DistributedAttention(torch.nn.Module):
    """Wrap ``local_attention`` (any callable ``(q, k, v, *args, **kwargs) -> context``).

    ``scatter_idx`` is the head dimension and ``gather_idx`` the sequence dimension of q/k/v
    (defaults fit the Megatron layout ``[s, b, h, d]``). Extra positional and keyword arguments
    (attention mask, dropout, ...) are forwarded to the local attention unchanged.
    """

    def __init__(self, local_attention, sequence_process_group, scatter_idx=2, gather_idx=0,
                 sp_stream=None):
        super().__init__()
        if sequence_process_group is None:
            raise ValueError("DistributedAttention needs a sequence-parallel process group, got None "
                             "(None would mean the whole world to torch.distributed)")
        if scatter_idx == gather_idx:
            raise ValueError(f"scatter_idx and gather_idx must differ, both are {scatter_idx}")
        self.local_attn = local_attention
        self.spg = sequence_process_group
        self.scatter_idx = scatter_idx
        self.gather_idx = gather_idx
        self.sp_stream = sp_stream  # accepted for API compatibility; CPU/gloo has no streams

    def forward(self, query, key, value, *args, **kwargs):
        q, k, v = (seq_all_to_all(t, self.spg, self.scatter_idx, self.gather_idx)
                   for t in (query, key, value))
        context = self.local_attn(q, k, v, *args, **kwargs)
        return seq_all_to_all(context, self.spg, self.gather_idx, self.scatter_idx)
