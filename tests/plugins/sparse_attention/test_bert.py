"""Hugging Face BERT / RoBERTa (the pinned transformers, built from configs) with sparse
self-attention: the conversion keeps the function for the dense pattern, pads and unpads
inputs, extends position embeddings, and trains with the engine on 2 CPU ranks."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from deepspeed.sparse_attention import (DenseSparsityConfig, FixedSparsityConfig,  # noqa: E402
                                        SparseAttentionUtils)
from deepspeed.sparse_attention.bert_sparse_self_attention import HFSparseSelfAttention  # noqa: E402
from deepspeed.testing.distributed import run_distributed  # noqa: E402

U = SparseAttentionUtils


def tiny_bert(kind="bert", seed=0, positions=64):
    torch.manual_seed(seed)
    cls = transformers.BertConfig if kind == "bert" else transformers.RobertaConfig
    config = cls(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=positions + (2 if kind == "roberta" else 0),
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=1,
                 attn_implementation="eager")
    model_cls = transformers.BertForMaskedLM if kind == "bert" else transformers.RobertaForMaskedLM
    return model_cls(config).eval()


def _inputs(batch=2, seq=37, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 50, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, seq - 9:] = 0
    ids[1, seq - 9:] = 1
    return ids, mask


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_dense_pattern_conversion_keeps_the_model_function(kind):
    model = tiny_bert(kind)
    ids, mask = _inputs()
    want = model(input_ids=ids, attention_mask=mask).logits
    U.replace_model_self_attention_with_sparse_self_attention(
        model, max_position=64, sparsity_config=DenseSparsityConfig(4, block=16))
    layers = getattr(model, kind).encoder.layer
    assert all(isinstance(layer.attention.self, HFSparseSelfAttention) for layer in layers)
    pad_len, ids_p, mask_p, _, _, _ = U.pad_to_block_size(16, ids, mask, None, None, None, 1, None)
    assert pad_len == 11 and ids_p.shape == (2, 48) and mask_p[:, 37:].eq(0).all()
    out = model(input_ids=ids_p, attention_mask=mask_p).logits
    out = U.unpad_sequence_output(pad_len, out)
    assert out.shape == want.shape
    keep = mask.bool()  # padded query positions are not compared: their outputs are unused
    torch.testing.assert_close(out[keep], want[keep], atol=1e-4, rtol=1e-4)


def test_pad_to_block_size_with_embeddings_and_all_fields():
    model = tiny_bert()
    emb = model.bert.embeddings.word_embeddings
    ids, mask = _inputs(seq=20)
    tt = torch.ones_like(ids)
    pos = torch.arange(20).expand(2, 20)
    embeds = emb(ids)
    pad_len, ids_p, mask_p, tt_p, pos_p, emb_p = U.pad_to_block_size(16, ids, mask, tt, pos, embeds, 1, emb)
    assert pad_len == 12
    assert ids_p[:, 20:].eq(1).all() and tt_p[:, 20:].eq(0).all() and pos_p[:, 20:].eq(1).all()
    torch.testing.assert_close(emb_p[:, 20:], emb(torch.ones(2, 12, dtype=torch.long)))
    assert U.pad_to_block_size(16, ids_p, mask_p, tt_p, pos_p, None, 1, emb)[0] == 0
    assert U.unpad_sequence_output(0, emb_p) is emb_p


def test_extend_position_embedding_repeats_the_trained_ones():
    model = tiny_bert(positions=128)
    original = model.bert.embeddings.position_embeddings.weight.detach().clone()
    U.extend_position_embedding(model, 512)
    new = model.bert.embeddings.position_embeddings.weight
    assert new.shape == (512, 32) and model.config.max_position_embeddings == 512
    for i in range(4):
        assert torch.equal(new[i * 128:(i + 1) * 128], original)
    ids = torch.randint(3, 50, (1, 300))
    assert model(input_ids=ids).logits.shape == (1, 300, 50)

    roberta = tiny_bert("roberta", positions=16)
    original = roberta.roberta.embeddings.position_embeddings.weight.detach().clone()
    U.extend_position_embedding(roberta, 64)
    new = roberta.roberta.embeddings.position_embeddings.weight
    assert new.shape == (66, 32) and torch.equal(new[:2], original[:2])
    assert all(torch.equal(new[2 + i * 16:2 + (i + 1) * 16], original[2:]) for i in range(4))
    with pytest.raises(ValueError, match="must be larger"):
        U.extend_position_embedding(tiny_bert(positions=64), 32)


def test_update_tokenizer_model_max_length():
    class Tok:
        model_max_length = 128
        init_kwargs = {"model_max_length": 128}

    tok = U.update_tokenizer_model_max_length(Tok(), 4096)
    assert tok.model_max_length == 4096 and tok.init_kwargs["model_max_length"] == 4096


def test_unsupported_model_is_refused():
    with pytest.raises(ValueError, match="'bert' and 'roberta'"):
        U.replace_model_self_attention_with_sparse_self_attention(torch.nn.Linear(2, 2), 64)


def test_fixed_pattern_bert_equals_dense_bert_under_the_layout_mask():
    """The converted model's attention is the original's restricted to the layout's blocks."""
    model = tiny_bert()
    cfg = FixedSparsityConfig(4, block=16, num_local_blocks=2)
    U.replace_model_self_attention_with_sparse_self_attention(model, 64, cfg)
    layer = model.bert.encoder.layer[0].attention.self
    hidden = torch.randn(2, 32, 32)
    out, _ = layer(hidden, attention_mask=None)
    q, k, v = (layer.transpose_for_scores(getattr(layer, n)(hidden)) for n in ("query", "key", "value"))
    mask = cfg.make_layout(32).bool().repeat_interleave(16, 1).repeat_interleave(16, 2)
    want = torch.softmax((q @ k.mT / 8 ** 0.5).masked_fill(~mask, float("-inf")), -1) @ v
    torch.testing.assert_close(out, want.permute(0, 2, 1, 3).reshape(2, 32, 32), atol=1e-5, rtol=1e-5)


def _train_sparse_bert(steps):
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.sparse_attention import SparseAttentionUtils as U
    from deepspeed.sparse_attention import get_sparse_attention_config

    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 6,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "sparse_attention": {"mode": "bigbird", "block": 16, "num_random_blocks": 1,
                                   "different_layout_per_head": True}}
    model = tiny_bert(seed=0)
    # BigBird's random blocks differ per rank until the modules synchronise them
    torch.manual_seed(100 + dist.get_rank() if dist.is_initialized() else 100)
    import random
    random.seed(dist.get_rank() if dist.is_initialized() else 0)
    U.replace_model_self_attention_with_sparse_self_attention(
        model, 64, get_sparse_attention_config(config, model.config.num_attention_heads))
    model.train()
    engine, *_ = deepspeed.initialize(model=model, config=config,
                                      model_parameters=model.parameters())
    assert type(get_sparse_attention_config(engine, 4)).__name__ == "BigBirdSparsityConfig"
    rank = dist.get_rank()
    losses = []
    for step in range(steps):
        ids, mask = _inputs(seed=10 * step + rank, seq=45)
        pad_len, ids, mask, _, _, _ = U.pad_to_block_size(16, ids, mask, None, None, None, 1, None)
        logits = engine(input_ids=ids, attention_mask=mask).logits
        logits = U.unpad_sequence_output(pad_len, logits)
        assert logits.shape == (2, 45, 50)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), ids[:, :45].reshape(-1))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    layout = engine.module.bert.encoder.layer[0].attention.self.sparse_self_attention.master_layout
    weight = engine.module.bert.encoder.layer[0].attention.self.query.weight.detach()
    return losses, layout.tolist(), weight.sum().item(), engine.module.bert.encoder.layer[0].attention.self.query.weight.grad is None


def test_sparse_bert_trains_with_the_engine_on_two_ranks():
    results = run_distributed(_train_sparse_bert, world_size=2, args=(3,), timeout=240)
    (losses0, layout0, w0, _), (losses1, layout1, w1, _) = results
    assert layout0 == layout1, "the random layout is synchronised from rank 0"
    assert w0 == pytest.approx(w1, rel=1e-6), "replicas stay identical after reduced steps"
    assert losses0[-1] < losses0[0] and losses1[-1] < losses1[0]
