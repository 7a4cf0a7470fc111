"""Shared pieces of the sequence-parallel tests: a tiny random Llama and full-sequence references."""
import torch

SP = 2


def tiny_llama(seed=0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM
    settings = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                    attn_implementation="sdpa")
    settings.update(overrides)
    config = LlamaConfig(**settings)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()


def weighted_sp_loss(loss, shift_labels, group):
    """The ALST example's combination: per-shard losses weighted by their non-ignored tokens,
    through a differentiable all_gather."""
    import torch.distributed.nn.functional as dnn
    losses = dnn.all_gather(loss, group=group)
    good = (shift_labels != -100).view(-1).sum()
    counts = dnn.all_gather(good, group=group)
    total = sum(l * c for l, c in zip(losses, counts) if c > 0)
    return total / max(sum(counts), 1)
