"""``SparseAttentionUtils``: put sparse self-attention into a Hugging Face BERT / RoBERTa model
and feed it inputs the kernels accept.

A block-sparse layout needs the sequence length to be a multiple of the block, so inputs are
padded (``pad_to_block_size``, the padding masked out) and the model's output cut back
(``unpad_sequence_output``). Longer sequences than the model was trained for need more position
embeddings: ``extend_position_embedding`` repeats the trained ones.
"""
import torch
import torch.nn.functional as F
from torch import nn

from deepspeed.sparse_attention.bert_sparse_self_attention import HFSparseSelfAttention
from deepspeed.sparse_attention.sparsity_config import FixedSparsityConfig

_SUPPORTED = "'bert' and 'roberta' (a model with a .bert / .roberta base, or the base model itself)"


def _base_and_kind(model):
    """``(base model with .embeddings/.encoder, 'bert' | 'roberta')``."""
    for kind in ("bert", "roberta"):
        if hasattr(model, kind):
            return getattr(model, kind), kind
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind in ("bert", "roberta") and hasattr(model, "encoder"):
        return model, kind
    raise ValueError(f"{type(model).__name__} is not supported: SparseAttentionUtils handles "
                     f"{_SUPPORTED}; extend it for your model type")


class SparseAttentionUtils:

    @staticmethod
    def extend_position_embedding(model, max_position):
        """Grow the position embeddings to ``max_position`` by repeating the trained ones
        (RoBERTa keeps its 2 reserved leading positions); returns the model."""
        base, kind = _base_and_kind(model)
        embeddings = base.embeddings
        original = embeddings.position_embeddings.weight
        offset = 2 if kind == "roberta" else 0
        old = original.shape[0] - offset
        total = max_position + offset
        if max_position <= old:
            raise ValueError(f"max_position ({max_position}) must be larger than the model's "
                             f"{old} position embeddings")
        extended = original.new_empty(total, original.shape[1])
        extended[:offset] = original[:offset]
        for start in range(offset, total, old):
            end = min(start + old, total)
            extended[start:end] = original[offset:offset + end - start]
        new = nn.Embedding(total, original.shape[1], padding_idx=embeddings.position_embeddings.padding_idx)
        new.weight.data = extended.detach().clone()
        embeddings.position_embeddings = new.to(original.device)
        embeddings.register_buffer("position_ids", torch.arange(total, device=original.device).expand((1, -1)),
                                   persistent=False)
        if hasattr(embeddings, "token_type_ids"):
            embeddings.register_buffer("token_type_ids", torch.zeros((1, total), dtype=torch.long,
                                                                     device=original.device),
                                       persistent=False)
        model.config.max_position_embeddings = total
        if base is not model:
            base.config.max_position_embeddings = total
        return model

    @staticmethod
    def update_tokenizer_model_max_length(tokenizer, max_position):
        """Let ``tokenizer`` produce sequences of up to ``max_position`` tokens."""
        tokenizer.model_max_length = max_position
        tokenizer.init_kwargs["model_max_length"] = max_position
        return tokenizer

    @staticmethod
    def replace_model_self_attention_with_sparse_self_attention(model, max_position,
                                                                sparsity_config=None):
        """Replace every self-attention of a BERT / RoBERTa model by ``HFSparseSelfAttention``
        (weights kept) for sequences of up to ``max_position`` tokens; returns the model."""
        base, kind = _base_and_kind(model)
        if sparsity_config is None:
            sparsity_config = FixedSparsityConfig(num_heads=model.config.num_attention_heads)
        positions = max_position + 2 if kind == "roberta" else max_position
        model.config.max_position_embeddings = positions
        base.config.max_position_embeddings = positions
        SparseAttentionUtils.replace_self_attention_layer_with_sparse_self_attention_layer(
            base.config, base.encoder.layer, sparsity_config)
        return model

    @staticmethod
    def replace_self_attention_layer_with_sparse_self_attention_layer(config, layers,
                                                                      sparsity_config=None):
        """Replace ``layer.attention.self`` of each layer, copying its query/key/value."""
        if sparsity_config is None:
            sparsity_config = FixedSparsityConfig(num_heads=config.num_attention_heads)
        for layer in layers:
            old = layer.attention.self
            new = HFSparseSelfAttention(config, sparsity_config)
            for name in ("query", "key", "value"):
                getattr(new, name).load_state_dict(getattr(old, name).state_dict())
            layer.attention.self = new.to(device=old.query.weight.device, dtype=old.query.weight.dtype)
        return layers

    @staticmethod
    def pad_to_block_size(block_size, input_ids, attention_mask, token_type_ids, position_ids,
                          inputs_embeds, pad_token_id, model_embeddings):
        """Pad the sequence dimension to a multiple of ``block_size``. Returns ``(pad_len,
        input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)``; the padding
        is masked out (attention mask 0), token type 0, ids/positions ``pad_token_id``."""
        if input_ids is None and inputs_embeds is None:
            raise ValueError("pad_to_block_size needs input_ids or inputs_embeds")
        batch, seq_len = input_ids.shape if input_ids is not None else inputs_embeds.shape[:-1]
        pad_len = (block_size - seq_len % block_size) % block_size
        if pad_len == 0:
            return 0, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds
        if inputs_embeds is not None:
            pad_ids = torch.full((batch, pad_len), pad_token_id, dtype=torch.long,
                                 device=inputs_embeds.device)
            inputs_embeds = torch.cat([inputs_embeds, model_embeddings(pad_ids)], dim=-2)
        if input_ids is not None:
            input_ids = F.pad(input_ids, (0, pad_len), value=pad_token_id)
        if position_ids is not None:
            position_ids = F.pad(position_ids, (0, pad_len), value=pad_token_id)
        device = (input_ids if input_ids is not None else inputs_embeds).device
        if attention_mask is None:
            attention_mask = torch.ones((batch, seq_len), dtype=torch.long, device=device)
        attention_mask = torch.cat([attention_mask, attention_mask.new_zeros(batch, pad_len)], dim=1)
        if token_type_ids is not None:
            token_type_ids = F.pad(token_type_ids, (0, pad_len), value=0)
        return pad_len, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds

    @staticmethod
    def unpad_sequence_output(pad_len, sequence_output):
        """Cut the ``pad_len`` padded positions off ``[batch, seq, ...]``."""
        if pad_len > 0:
            sequence_output = sequence_output[:, :-pad_len]
        return sequence_output
