"""Vocabulary-parallel input embedding and LM head for AutoTP.

The word embedding and the LM head are often the largest matrices of a small model (a 32k
vocabulary times the hidden size, each), so leaving them whole on every rank keeps a large part
of the model replicated. Both are split along the vocabulary:

- ``VocabParallelEmbedding`` holds rows ``[start, start + n)`` of the table; ids outside it look
  up zeros, and an all-reduce over the tensor-parallel group sums the ranks' results. Exactly one
  rank contributes each row, so the output equals the whole table's lookup bit for bit.
- ``VocabParallelLMHead`` holds the same vocabulary rows of the output projection (the same
  ``Parameter`` when the model ties the two) and all-gathers the per-rank logits, so every rank
  gets the full, exact logits (no partial sums: greedy decoding picks the same tokens).

Vocabularies that ``tp_size`` does not divide are split unevenly (``sharding.shard_sizes``).
"""
import torch
import torch.nn.functional as F
from torch import nn

from deepspeed import comm as dist
from deepspeed.tensor_parallel import (frozen, mark, narrow_fn, replace_everywhere,
                                       shard_range, shard_sizes, take_shard)


class VocabParallelEmbedding(nn.Module):
    """Rows ``[vocab_start, vocab_start + weight.shape[0])`` of an ``nn.Embedding`` table."""

    def __init__(self, weight, vocab_start, num_embeddings, group=None, padding_idx=None):
        super().__init__()
        self.weight = frozen(weight)
        self.vocab_start = vocab_start
        self.num_embeddings = num_embeddings
        self.embedding_dim = self.weight.shape[1]
        self.padding_idx = padding_idx
        self.mp_group = group

    def forward(self, ids):
        end = self.vocab_start + self.weight.shape[0]
        outside = (ids < self.vocab_start) | (ids >= end)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0)
        dist.inference_all_reduce(out, group=self.mp_group)
        return out

    def extra_repr(self):
        return (f"rows {self.vocab_start}..{self.vocab_start + self.weight.shape[0]} of "
                f"{self.num_embeddings}, embedding_dim={self.embedding_dim}")


class VocabParallelLMHead(nn.Module):
    """Output projection holding ``sizes[rank]`` vocabulary rows; the logits are gathered."""

    def __init__(self, weight, bias, sizes, rank, group=None):
        super().__init__()
        self.weight = frozen(weight)
        self.bias = None if bias is None else frozen(bias)
        self.sizes = list(sizes)
        self.rank = rank
        self.mp_group = group

    @property
    def in_features(self):
        return self.weight.shape[1]

    @property
    def out_features(self):
        return sum(self.sizes)

    def forward(self, x):
        local = F.linear(x, self.weight, self.bias)
        width = max(self.sizes)
        if local.shape[-1] < width:  # uneven vocabulary: all_gather needs equal shapes
            local = F.pad(local, (0, width - local.shape[-1]))
        parts = [torch.empty_like(local) for _ in self.sizes]
        dist.all_gather(parts, local.contiguous(), group=self.mp_group)
        return torch.cat([p[..., :n] for p, n in zip(parts, self.sizes)], dim=-1)

    def extra_repr(self):
        return f"in_features={self.in_features}, vocabulary rows {self.sizes[self.rank]} of {self.out_features}"


def shard_vocab(model, tp_size, rank, group):
    """Split ``model``'s input embedding and LM head (Hugging Face ``get_input_embeddings`` /
    ``get_output_embeddings``) along the vocabulary. Returns the names of what it split; a model
    without those methods, or whose modules are not a plain ``nn.Embedding`` / ``nn.Linear``
    (scaled or otherwise specialised subclasses), keeps them whole."""
    split = []
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    embedding = get_in() if callable(get_in) else None
    head = get_out() if callable(get_out) else None
    shared = None
    if type(embedding) is nn.Embedding and embedding.max_norm is None:
        vocab = embedding.num_embeddings
        start, _ = shard_range(vocab, tp_size, rank)
        take = narrow_fn(0, tp_size, rank)
        weight = frozen(take_shard(embedding.weight.data, take))
        mark(weight, take)
        new = VocabParallelEmbedding(weight, start, vocab, group, embedding.padding_idx)
        if head is not None and getattr(head, "weight", None) is embedding.weight:
            shared = new.weight
        # every module using this table: T5's encoder / decoder ``embed_tokens`` tie their
        # weight to ``shared`` as modules of their own
        for twin in [m for m in model.modules()
                     if type(m) is nn.Embedding and m.weight is embedding.weight]:
            replace_everywhere(model, twin, new)
        split.append("input_embeddings")
    if type(head) is nn.Linear:
        vocab = head.out_features
        take = narrow_fn(0, tp_size, rank)
        weight = shared if shared is not None else mark(
            frozen(take_shard(head.weight.data, take)), take)
        bias = None
        if head.bias is not None:
            bias = mark(frozen(take_shard(head.bias.data, take)), take)
        new = VocabParallelLMHead(weight, bias, shard_sizes(vocab, tp_size), rank, group)
        replace_everywhere(model, head, new)
        split.append("output_embeddings")
    return split
