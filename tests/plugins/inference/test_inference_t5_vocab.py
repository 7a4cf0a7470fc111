"""T5 (encoder-decoder, per-head relative attention bias, tied embeddings) under AutoTP and the
``injection_policy`` of the docs, and the vocabulary-parallel embedding / LM head, on 2 gloo
ranks: logits equal the single-process model (fp32, 1e-5), greedy ``generate`` gives the same
tokens, each rank holds half of every split weight, uneven sizes included."""
import pytest
import torch

from inference_models import VOCAB, build, input_ids, split_matches

T5_POLICY = ("SelfAttention.o", "EncDecAttention.o", "DenseReluDense.wo")


def _t5_matches_single_process(manual):
    import deepspeed
    from deepspeed.module_inject import LinearAllreduce, LinearLayer
    from deepspeed.inference.vocab_parallel import VocabParallelEmbedding, VocabParallelLMHead
    from transformers.models.t5.modeling_t5 import T5Block

    model, _ = build("t5")
    ids, dec = input_ids(), input_ids(length=5, seed=2)
    with torch.no_grad():
        reference = model(input_ids=ids, decoder_input_ids=dec).logits
        ref_tokens = model.generate(ids, max_new_tokens=6, do_sample=False)
    full_bias = model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.shape
    kwargs = {"dtype": torch.float, "tensor_parallel": {"tp_size": 2}}
    if manual:
        kwargs["injection_policy"] = {T5Block: T5_POLICY}
    engine = deepspeed.init_inference(model, **kwargs)
    m = engine.module
    with torch.no_grad():
        logits = engine(input_ids=ids, decoder_input_ids=dec).logits
        tokens = engine.generate(ids, max_new_tokens=6, do_sample=False)
    attn = m.encoder.block[0].layer[0].SelfAttention
    return {
        "max_diff": (logits - reference).abs().max().item(),
        "same_tokens": torch.equal(tokens, ref_tokens),
        "rows": sorted(n for n, x in m.named_modules() if isinstance(x, LinearAllreduce)),
        "cols": sum(isinstance(x, LinearLayer) for x in m.modules()),
        "o_shape": tuple(attn.o.weight.shape), "heads": attn.n_heads,
        "bias_shape": (tuple(attn.relative_attention_bias.weight.shape), tuple(full_bias)),
        "embedding": (isinstance(m.shared, VocabParallelEmbedding), m.encoder.embed_tokens is m.shared,
                      tuple(m.shared.weight.shape)),
        "head": (isinstance(m.lm_head, VocabParallelLMHead), m.lm_head.weight is m.shared.weight),
        "embed_rows": m.shared.weight.detach().clone(),
    }


@pytest.mark.parametrize("manual", [False, True], ids=["autotp", "injection_policy"])
def test_t5_tp2_equals_single_process(dist_pool, manual):
    results = dist_pool.run(_t5_matches_single_process, world_size=2, args=(manual,))
    for r in results:
        assert r["max_diff"] <= 1e-5 and r["same_tokens"], r["max_diff"]
        # per block: encoder SelfAttention.o + wo, decoder SelfAttention.o + EncDecAttention.o + wo
        assert len(r["rows"]) == 2 * 2 + 2 * 3, r["rows"]
        assert all(n.split(".")[-1] in ("o", "wo") for n in r["rows"])
        assert r["cols"] == 2 * 4 + 2 * 7  # encoder q, k, v, wi; decoder twice q, k, v, and wi
        assert r["o_shape"] == (32, 16) and r["heads"] == 2
        assert r["bias_shape"] == ((8, 2), (8, 4))  # relative attention bias split by heads
        assert r["embedding"] == (True, True, (VOCAB // 2, 32))
        assert r["head"] == (True, True)  # tied LM head keeps sharing the embedding shard
    assert not torch.equal(results[0]["embed_rows"], results[1]["embed_rows"])


def _uneven_vocab_and_mlp():
    """Vocabulary 65 and MLP width 51 over 2 ranks: 33 + 32 and 26 + 25 rows."""
    import transformers as tf
    from deepspeed import comm as dist

    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=65, hidden_size=32, intermediate_size=51, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)).eval()
    ids = torch.randint(0, 65, (2, 9), generator=torch.Generator().manual_seed(4))
    ids[0, 0] = 64  # the last row, on the smaller rank
    engine, diff, same = split_matches(model, ids)
    m = engine.module.model
    return (diff, same, m.embed_tokens.weight.shape[0], engine.module.lm_head.weight.shape[0],
            m.layers[0].mlp.up_proj.weight.shape[0], m.layers[0].mlp.down_proj.weight.shape[1],
            dist.get_rank())


def test_uneven_vocabulary_and_mlp_width(dist_pool):
    results = dist_pool.run(_uneven_vocab_and_mlp, world_size=2)
    for diff, same, emb, head, up, down, rank in results:
        assert diff <= 1e-5 and same
        assert emb == head == (33 if rank == 0 else 32)
        assert up == down == (26 if rank == 0 else 25)


def _llama_per_rank_weight_bytes():
    import deepspeed
    from deepspeed.inference.sharding import parameter_bytes

    model, _ = build("llama")
    full = parameter_bytes(model)
    engine = deepspeed.init_inference(model, dtype=torch.float, tensor_parallel={"tp_size": 2})
    return parameter_bytes(engine.module) / full


def test_embeddings_and_head_split_bring_weights_near_half(dist_pool):
    # norms stay whole on every rank: the tiny model is a little over half
    for ratio in dist_pool.run(_llama_per_rank_weight_bytes, world_size=2):
        assert 0.5 <= ratio <= 0.53, ratio
