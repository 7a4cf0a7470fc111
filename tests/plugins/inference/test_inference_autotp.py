"""AutoTP on 2 gloo ranks: ``init_inference(tensor_parallel={"tp_size": 2})`` halves each
eligible Linear of tiny Llama (GQA), Mistral, OPT, BERT, GPT-NeoX and Falcon (GQA, fused
query_key_value) models, and the logits (and greedy
generation) equal the single-process model computed in the same rank."""
import pytest
import torch

from inference_models import MODELS, ROW_NAMES, block_class, build, input_ids


def _split_matches_single_process(name, manual):
    import deepspeed
    from deepspeed.module_inject import LinearAllreduce, LinearLayer

    model, decoder = build(name)
    ids = input_ids()
    with torch.no_grad():
        reference = model(ids).logits
        ref_tokens = (model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
                      if decoder else None)
    full = {n: tuple(m.weight.shape) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear)}
    kwargs = {"dtype": torch.float, "tensor_parallel": {"tp_size": 2}}
    if manual:
        kwargs["injection_policy"] = {block_class(model): ROW_NAMES[name]}
    engine = deepspeed.init_inference(model, **kwargs)
    rows, cols, kept = [], [], []
    for n, m in engine.module.named_modules():
        if isinstance(m, LinearAllreduce):
            assert m.weight.shape == (full[n][0], full[n][1] // 2), n
            rows.append(n)
        elif isinstance(m, LinearLayer):
            assert m.weight.shape == (full[n][0] // 2, full[n][1]), n
            cols.append(n)
        elif isinstance(m, torch.nn.Linear):
            kept.append(n)
    with torch.no_grad():
        logits = engine(ids).logits
        tokens = (engine.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
                  if decoder else None)
    return {
        "max_diff": (logits - reference).abs().max().item(),
        "same_tokens": None if not decoder else torch.equal(tokens, ref_tokens),
        "rows": sorted(rows), "cols": len(cols), "kept": kept,
        "weights": {n: p.detach().clone() for n, p in engine.module.named_parameters()
                    if n.endswith("layers.0.self_attn.o_proj.weight")
                    or n.endswith("layer.0.output.dense.weight")},
    }


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("manual", [False, True], ids=["autotp", "injection_policy"])
def test_tp2_equals_single_process(dist_pool, name, manual):
    results = dist_pool.run(_split_matches_single_process, world_size=2, args=(name, manual))
    for rank, result in enumerate(results):
        assert result["max_diff"] <= 1e-5, (rank, result["max_diff"])
        if result["same_tokens"] is not None:
            assert result["same_tokens"], rank
        assert len(result["rows"]) == 2 * 2  # two per block, two blocks
        assert result["cols"] >= 2 * 2  # fused query_key_value (GPT-NeoX, Falcon): 2 a block
        assert all(n.split(".")[-1] in ("lm_head", "decoder", "dense", "project_out",
                                        "project_in") for n in result["kept"]), result["kept"]
    assert results[0]["rows"] == results[1]["rows"]
    # the two ranks hold different halves
    for key in results[0]["weights"]:
        assert not torch.equal(results[0]["weights"][key], results[1]["weights"][key])


def _autotp_and_manual_policy_agree(name):
    import deepspeed

    ids = input_ids(seed=3)
    model, _ = build(name)
    auto = deepspeed.init_inference(model, dtype=torch.float, tensor_parallel={"tp_size": 2})
    model2, _ = build(name)
    # BERT through the API reference's policy class, the others through the Linear names
    rows = deepspeed.inference.HFBertLayerPolicy if name == "bert" else ROW_NAMES[name]
    manual = deepspeed.init_inference(model2, dtype=torch.float, mp_size=2,
                                      injection_policy={block_class(model2): rows})
    with torch.no_grad():
        return torch.equal(auto(ids).logits, manual(ids).logits), [r for _, r in manual.policy]


def test_injection_policy_path_equals_autotp(dist_pool):
    for name in ("llama", "bert"):
        for same, rows in dist_pool.run(_autotp_and_manual_policy_agree, world_size=2,
                                        args=(name,)):
            assert same and rows == [ROW_NAMES[name]], (name, rows)


def _error_of(case):
    import deepspeed
    import transformers as tf

    try:
        if case == "heads":  # 3 heads cannot be split over 2 ranks
            torch.manual_seed(0)
            model = tf.OPTForCausalLM(tf.OPTConfig(vocab_size=64, hidden_size=24, ffn_dim=48,
                                                   num_hidden_layers=1, num_attention_heads=3,
                                                   word_embed_proj_dim=24))
            deepspeed.init_inference(model, dtype=torch.float, tensor_parallel={"tp_size": 2})
        elif case == "kv_heads":  # GQA with 1 key/value head
            torch.manual_seed(0)
            model = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=64, hidden_size=32,
                                                       intermediate_size=64, num_hidden_layers=1,
                                                       num_attention_heads=4,
                                                       num_key_value_heads=1))
            deepspeed.init_inference(model, dtype=torch.float, tensor_parallel={"tp_size": 2})
        elif case == "world":
            deepspeed.init_inference(torch.nn.Linear(4, 4), dtype=torch.float,
                                     tensor_parallel={"tp_size": 3})
        elif case == "no_policy":
            deepspeed.init_inference(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                                         torch.nn.Linear(8, 4)),
                                     dtype=torch.float, tensor_parallel={"tp_size": 2})
        elif case == "unknown_block":
            class Block(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.up = torch.nn.Linear(4, 8)
                    self.back = torch.nn.Linear(8, 4)

            class Net(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.blocks = torch.nn.ModuleList([Block(), Block()])

            deepspeed.init_inference(Net(), dtype=torch.float, tensor_parallel={"tp_size": 2})
        elif case == "wrong_name":
            model, _ = build("llama")
            deepspeed.init_inference(model, dtype=torch.float, tensor_parallel={"tp_size": 2},
                                     injection_policy={block_class(model): ("attn.out",)})
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.mark.parametrize("case, words", [
    ("heads", ["tp_size=2", "num_heads=3"]),
    ("kv_heads", ["tp_size=2", "num_key_value_heads=1"]),
    ("world", ["tp_size=3", "world size 2"]),
    ("no_policy", ["injection_policy", "Sequential"]),
    ("unknown_block", ["injection_policy", "Block"]),
    ("wrong_name", ["attn.out", "self_attn.o_proj"]),
])
def test_bad_input_gives_clear_errors(dist_pool, case, words):
    for message in dist_pool.run(_error_of, world_size=2, args=(case,)):
        assert message is not None and all(w in message for w in words), message


def _replace_transformer_layer_splits_like_autotp():
    from deepspeed.inference.config import DeepSpeedInferenceConfig
    from deepspeed.module_inject import replace_transformer_layer

    ids = input_ids(seed=5)
    model, _ = build("opt")
    with torch.no_grad():
        reference = model(ids).logits
    config = DeepSpeedInferenceConfig(dtype=torch.float, tensor_parallel={"tp_size": 2},
                                      injection_policy_tuple=("self_attn.out_proj", "fc2"))
    replace_transformer_layer(block_class(model), model, config=config)
    with torch.no_grad():
        return (model(ids).logits - reference).abs().max().item()


def test_replace_transformer_layer_tensor_slicing(dist_pool):
    for diff in dist_pool.run(_replace_transformer_layer_splits_like_autotp, world_size=2):
        assert diff <= 1e-5


class _Block(torch.nn.Module):
    """A block AutoTP has no policy for: only ``injection_policy_tuple`` can split it."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(4, 8)
        self.back = torch.nn.Linear(8, 4)

    def forward(self, x):
        return x + self.back(torch.relu(self.up(x)))


def _replace_with_a_policy_tuple():
    from deepspeed.inference.config import DeepSpeedInferenceConfig
    from deepspeed.module_inject import replace_transformer_layer

    torch.manual_seed(0)
    model = torch.nn.Sequential(_Block(), _Block())
    x = torch.randn(3, 4)
    with torch.no_grad():
        reference = model(x)
    config = DeepSpeedInferenceConfig(dtype=torch.float, tensor_parallel={"tp_size": 2},
                                      injection_policy_tuple=("back",))
    replace_transformer_layer(_Block, model, config=config)
    with torch.no_grad():
        diff = (model(x) - reference).abs().max().item()
    return diff, tuple(model[0].up.weight.shape), tuple(model[0].back.weight.shape)


def test_injection_policy_tuple_splits_a_block_autotp_cannot_parse(dist_pool):
    # "back" is row-parallel (its inputs split, outputs summed), "up" column-parallel
    for diff, up, back in dist_pool.run(_replace_with_a_policy_tuple, world_size=2):
        assert up == (4, 4) and back == (4, 4)
        assert diff <= 1e-6
