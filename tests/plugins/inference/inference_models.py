"""Tiny Hugging Face models built from configs (no downloads), seeded so every rank builds the
same weights, for the inference plugin's tensor-parallel tests."""
import torch

VOCAB = 64


def build(name, seed=0):
    """``(model, decoder?)`` for ``name`` in ``MODELS``, in eval mode."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64)
    if name == "llama":  # GQA: 4 query heads, 2 key/value heads
        model = tf.LlamaForCausalLM(tf.LlamaConfig(intermediate_size=64, num_key_value_heads=2,
                                                   **common))
    elif name == "mistral":
        model = tf.MistralForCausalLM(tf.MistralConfig(intermediate_size=64,
                                                       num_key_value_heads=2, **common))
    elif name == "mixtral":  # 4 experts (stacked 3-D weights), top-2, GQA
        model = tf.MixtralForCausalLM(tf.MixtralConfig(
            intermediate_size=48, num_key_value_heads=2, num_local_experts=4,
            num_experts_per_tok=2, **common))
    elif name == "opt":
        model = tf.OPTForCausalLM(tf.OPTConfig(ffn_dim=64, word_embed_proj_dim=32, **common))
    elif name == "gpt_neox":
        model = tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(intermediate_size=64, **common))
    elif name == "falcon":  # new decoder architecture, grouped query/key/value
        model = tf.FalconForCausalLM(tf.FalconConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_kv_heads=2, new_decoder_architecture=True, bias=True))
    elif name == "t5":  # encoder-decoder, relative attention bias, tied embeddings
        model = tf.T5ForConditionalGeneration(tf.T5Config(
            vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2,
            num_heads=4, relative_attention_num_buckets=8, decoder_start_token_id=0))
    elif name == "bert":
        model = tf.BertForMaskedLM(tf.BertConfig(intermediate_size=64, **common))
    else:
        raise ValueError(name)
    return model.eval(), name != "bert"


MODELS = ("llama", "mistral", "opt", "bert", "gpt_neox", "falcon")
# the Linears inside each block that write into the residual stream
ROW_NAMES = {
    "llama": ("self_attn.o_proj", "mlp.down_proj"),
    "mistral": ("self_attn.o_proj", "mlp.down_proj"),
    "opt": ("self_attn.out_proj", "fc2"),
    "bert": ("attention.output.dense", "output.dense"),
    "gpt_neox": ("attention.dense", "mlp.dense_4h_to_h"),
    "falcon": ("self_attention.dense", "mlp.dense_4h_to_h"),
}


def block_class(model):
    from deepspeed.module_inject import AutoTP

    return AutoTP.block_classes(model)[0]


def input_ids(batch=2, length=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=g)


def logits_and_tokens(model, ids, new_tokens=5, **kwargs):
    """``(logits, greedy tokens)`` of ``model`` (a model or an engine) for ``ids``."""
    with torch.no_grad():
        logits = model(ids, **kwargs).logits
        tokens = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return logits, tokens


def split_matches(model, ids, new_tokens=5, **init_kwargs):
    """Run ``model``, split it with ``init_inference(dtype=float, tp_size=2, **init_kwargs)``
    and run it again: ``(engine, max logits difference, same greedy tokens)``."""
    import deepspeed

    reference, ref_tokens = logits_and_tokens(model, ids, new_tokens)
    engine = deepspeed.init_inference(model, dtype=torch.float, tensor_parallel={"tp_size": 2},
                                      **init_kwargs)
    logits, tokens = logits_and_tokens(engine, ids, new_tokens)
    return engine, (logits - reference).abs().max().item(), torch.equal(tokens, ref_tokens)
