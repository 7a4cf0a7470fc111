"""``BertSparseSelfAttention``: BERT's self-attention (query/key/value projections) with the
attention itself computed by ``SparseSelfAttention``; and ``HFSparseSelfAttention``, the same
module speaking the call convention of the Hugging Face BERT / RoBERTa layers it replaces
(4-D masks in, ``(context, attention_weights)`` out).
"""
import torch
from torch import nn

from deepspeed.sparse_attention.sparse_self_attention import SparseSelfAttention
from deepspeed.sparse_attention.sparsity_config import FixedSparsityConfig


class BertSparseSelfAttention(nn.Module):
    """``forward(hidden_states, attention_mask)`` -> context ``[batch, seq, hidden]``; the mask
    is a key padding mask (``[batch, seq]`` or BERT's extended ``[batch, 1, 1, seq]``), added to
    the scores (0 keeps, large negative drops)."""

    def __init__(self, config, sparsity_config=None, backend=None):
        super().__init__()
        if config.hidden_size % config.num_attention_heads != 0:
            raise ValueError(f"The hidden size ({config.hidden_size}) is not a multiple of the "
                             f"number of attention heads ({config.num_attention_heads})")
        if sparsity_config is None:
            sparsity_config = FixedSparsityConfig(num_heads=config.num_attention_heads)
        if sparsity_config.num_heads != config.num_attention_heads:
            raise ValueError(f"sparsity_config was made for num_heads={sparsity_config.num_heads} "
                             f"but the model has {config.num_attention_heads} attention heads")
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(config.hidden_size, self.all_head_size)
        self.key = nn.Linear(config.hidden_size, self.all_head_size)
        self.value = nn.Linear(config.hidden_size, self.all_head_size)
        # RoBERTa counts 2 reserved positions in max_position_embeddings: the longest sequence
        # the layout must cover is the largest multiple of the block that fits
        longest = config.max_position_embeddings // sparsity_config.block * sparsity_config.block
        self.sparse_self_attention = SparseSelfAttention(
            sparsity_config, max_seq_length=longest, backend=backend)

    def transpose_for_scores(self, x):
        return x.view(*x.shape[:-1], self.num_attention_heads, self.attention_head_size).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None):
        query = self.transpose_for_scores(self.query(hidden_states))
        key = self.transpose_for_scores(self.key(hidden_states))
        value = self.transpose_for_scores(self.value(hidden_states))
        context = self.sparse_self_attention(query, key, value, key_padding_mask=attention_mask)
        context = context.permute(0, 2, 1, 3).contiguous()
        return context.view(*context.shape[:-2], self.all_head_size)


def key_padding_from_hf_mask(mask, dtype):
    """An additive ``[batch, seq]`` key padding mask from what a transformers layer passes:
    None, a bool 4-D mask (True attends) or an additive float 4-D mask (query row 0 is taken:
    a padding mask is the same for every query)."""
    if mask is None:
        return None
    if mask.dim() == 4:
        mask = mask[:, 0, 0, :]
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(dtype).min)
    return mask.to(dtype)


class HFSparseSelfAttention(BertSparseSelfAttention):
    """What ``SparseAttentionUtils`` puts in place of a transformers ``BertSelfAttention`` /
    ``RobertaSelfAttention``."""

    def forward(self, hidden_states, attention_mask=None, past_key_values=None,
                encoder_hidden_states=None, **kwargs):
        if past_key_values is not None or encoder_hidden_states is not None:
            raise NotImplementedError("sparse self-attention supports neither cached keys "
                                      "(past_key_values) nor cross-attention")
        mask = key_padding_from_hf_mask(attention_mask, hidden_states.dtype)
        return super().forward(hidden_states, mask), None
