"""DeepSpeedTransformerLayer on the torch path: HF BertLayer (Post-LN) and a Pre-LN reference,
forward and backward; the memory flags change nothing but what backward keeps (measured)."""
import copy
import json

import pytest
import torch

import deepspeed
from deepspeed.ops.transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer
from transformer_reference import hf_bert_layer, hf_grads, pre_ln_reference
from triton_check_runner import needs_cuda, needs_triton, run_checks

NAMES = ["attn_qkvw", "attn_qkvb", "attn_ow", "attn_ob", "attn_nw", "attn_nb", "inter_w", "inter_b",
         "output_w", "output_b", "norm_w", "norm_b"]
FLAGS = ("normalize_invertible", "gelu_checkpoint", "attn_dropout_checkpoint")


def _config(**kw):
    base = dict(batch_size=2, max_seq_length=16, hidden_size=32, heads=4, intermediate_size=64,
                attn_dropout_ratio=0.0, hidden_dropout_ratio=0.0, num_hidden_layers=2,
                initializer_range=0.02, seed=7, pre_layer_norm=False)
    base.update(kw)
    return DeepSpeedTransformerConfig(**base)


def _layer(**kw):
    torch.manual_seed(0)
    layer = DeepSpeedTransformerLayer(_config(**kw))
    layer.config.layer_id = 0  # the dropout RNG is seeded with seed + layer_id: same masks
    with torch.no_grad():  # non-trivial LayerNorm params and biases so every term is exercised
        for name in NAMES:
            if name.endswith(("b", "nw")) or name == "norm_w":
                getattr(layer, name).add_(0.1 * torch.randn_like(getattr(layer, name)))
    return layer


def _inputs(batch=2, seq=16, hidden=32):
    torch.manual_seed(1)
    x = torch.randn(batch, seq, hidden, requires_grad=True)
    mask = torch.zeros(batch, 1, 1, seq)
    mask[1, ..., -5:] = -10000.0  # BERT's extended additive padding mask
    return x, mask


def _run(layer, x, mask):
    out = layer(x, mask)
    out = out[0] if isinstance(out, tuple) else out
    grad_out = torch.linspace(-1, 1, out.numel()).view_as(out)
    gx, *gp = torch.autograd.grad(out, [x] + [getattr(layer, n) for n in NAMES], grad_out)
    return out.detach(), gx, dict(zip(NAMES, gp))


def _close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_config_documented_defaults_and_tutorial_keys():
    c = DeepSpeedTransformerConfig()
    expected = dict(batch_size=-1, hidden_size=-1, heads=-1, attn_dropout_ratio=-1,
                    hidden_dropout_ratio=-1, num_hidden_layers=-1, initializer_range=-1,
                    layer_norm_eps=1e-12, local_rank=-1, seed=-1, fp16=False, pre_layer_norm=True,
                    normalize_invertible=False, gelu_checkpoint=False, adjust_init_range=True,
                    attn_dropout_checkpoint=False, stochastic_mode=False, return_tuple=False,
                    training=True, max_seq_length=-1)
    assert {k: getattr(c, k) for k in expected} == expected
    assert DeepSpeedTransformerConfig(hidden_size=64).intermediate_size == 256
    assert DeepSpeedTransformerConfig(hidden_size=64, intermediate_size=100).intermediate_size == 100
    # the tutorial's snippet, verbatim keywords
    t = DeepSpeedTransformerConfig(batch_size=64, max_seq_length=128, hidden_size=1024, heads=16,
                                   attn_dropout_ratio=0.1, hidden_dropout_ratio=0.1,
                                   num_hidden_layers=24, initializer_range=0.02, local_rank=0,
                                   seed=1234, fp16=True, pre_layer_norm=True,
                                   attn_dropout_checkpoint=False, normalize_invertible=False,
                                   gelu_checkpoint=False)
    assert t.max_seq_length == 128 and t.intermediate_size == 4096


def test_config_from_dict_and_json_file(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"hidden_size": 16, "heads": 2, "pre_layer_norm": False}))
    c = DeepSpeedTransformerConfig.from_json_file(path)
    assert (c.hidden_size, c.heads, c.pre_layer_norm, c.intermediate_size) == (16, 2, False, 64)
    with pytest.raises(ValueError, match="unknown key.*hiden_size"):
        DeepSpeedTransformerConfig.from_dict({"hiden_size": 16})


def test_importable_from_deepspeed_and_the_documented_module():
    assert deepspeed.DeepSpeedTransformerConfig is DeepSpeedTransformerConfig
    assert deepspeed.DeepSpeedTransformerLayer is DeepSpeedTransformerLayer


def test_parameter_names_and_shapes():
    layer = DeepSpeedTransformerLayer(_config(hidden_size=32, intermediate_size=48))
    shapes = {n: tuple(p.shape) for n, p in layer.named_parameters()}
    assert shapes == {"attn_qkvw": (96, 32), "attn_qkvb": (96,), "attn_ow": (32, 32), "attn_ob": (32,),
                      "attn_nw": (32,), "attn_nb": (32,), "inter_w": (48, 32), "inter_b": (48,),
                      "output_w": (32, 48), "output_b": (32,), "norm_w": (32,), "norm_b": (32,)}


def test_layer_id_counts_instances_and_deepcopy_works():
    first = DeepSpeedTransformerLayer(_config())
    second = DeepSpeedTransformerLayer(_config())
    assert second.config.layer_id == first.config.layer_id + 1
    assert DeepSpeedTransformerLayer.layer_id == second.config.layer_id + 1
    layers = torch.nn.ModuleList([copy.deepcopy(DeepSpeedTransformerLayer(_config())) for _ in range(3)])
    ids = [layer.config.layer_id for layer in layers]
    assert ids == list(range(ids[0], ids[0] + 3))
    clone = copy.deepcopy(first)
    x, mask = _inputs()
    _close(clone(x, mask), first(x, mask), 0)
    with torch.no_grad():
        clone.attn_ob.add_(1.0)
    assert not torch.equal(clone.attn_ob, first.attn_ob)  # the copy owns its parameters


def test_init_std_adjusted_for_output_layers():
    torch.manual_seed(0)
    layer = DeepSpeedTransformerLayer(DeepSpeedTransformerConfig(
        hidden_size=512, heads=8, num_hidden_layers=8, initializer_range=0.02))
    assert abs(layer.attn_qkvw.std().item() - 0.02) < 1e-3
    for name in ("attn_ow", "output_w"):
        assert abs(getattr(layer, name).std().item() - 0.02 / 4.0) < 3e-4
    flat = DeepSpeedTransformerLayer(DeepSpeedTransformerConfig(
        hidden_size=512, heads=8, num_hidden_layers=8, initializer_range=0.02, adjust_init_range=False))
    assert abs(flat.output_w.std().item() - 0.02) < 1e-3
    assert torch.all(layer.attn_qkvb == 0) and torch.all(layer.norm_w == 1)


def test_post_ln_equals_hf_bert_layer_forward_and_backward():
    layer = _layer(pre_layer_norm=False)
    x, mask = _inputs()
    out, gx, grads = _run(layer, x, mask)
    ref = hf_bert_layer(layer)
    ref_out = ref(x, mask)
    ref_out = ref_out[0] if isinstance(ref_out, tuple) else ref_out
    x.grad = None
    ref_out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    ref_gx = x.grad
    _close(out, ref_out.detach())
    _close(gx, ref_gx)
    for name, g in hf_grads(ref, 32).items():
        _close(grads[name], g)


def test_pre_ln_equals_torch_reference_forward_and_backward():
    layer = _layer(pre_layer_norm=True)
    x, mask = _inputs()
    out, gx, grads = _run(layer, x, mask)
    params = {n: getattr(layer, n).detach().clone().requires_grad_() for n in NAMES}
    ref = pre_ln_reference(params, x, mask, 4, layer.config.layer_norm_eps)
    ref_g = torch.autograd.grad(ref, [x] + [params[n] for n in NAMES],
                                torch.linspace(-1, 1, out.numel()).view_as(out))
    _close(out, ref.detach())
    _close(gx, ref_g[0])
    for name, g in zip(NAMES, ref_g[1:]):
        _close(grads[name], g)


@pytest.mark.parametrize("pre_ln", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_memory_flags_change_neither_outputs_nor_gradients(pre_ln, dropout):
    """With a seeded dropout the masks are drawn in the same order with the flags on or off."""
    x, mask = _inputs()
    base = _run(_layer(pre_layer_norm=pre_ln, attn_dropout_ratio=dropout, hidden_dropout_ratio=dropout), x, mask)
    for flags in [{f: True} for f in FLAGS] + [{f: True for f in FLAGS}]:
        got = _run(_layer(pre_layer_norm=pre_ln, attn_dropout_ratio=dropout,
                          hidden_dropout_ratio=dropout, **flags), x, mask)
        _close(got[0], base[0], 1e-6)
        _close(got[1], base[1], 2e-6)
        for name in NAMES:
            _close(got[2][name], base[2][name], 2e-6)


def _saved_activation_bytes(layer, x, mask):
    """Bytes autograd keeps for backward, counting each storage once and no parameter."""
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, mask)
    return sum(seen.values())


@pytest.mark.parametrize("pre_ln", [False, True])
def test_each_memory_flag_shrinks_saved_activations(pre_ln):
    x, mask = _inputs(batch=2, seq=32, hidden=32)
    kw = dict(pre_layer_norm=pre_ln, attn_dropout_ratio=0.1, hidden_dropout_ratio=0.1)
    base = _saved_activation_bytes(_layer(**kw), x, mask)
    sizes = {f: _saved_activation_bytes(_layer(**kw, **{f: True}), x, mask) for f in FLAGS}
    every = _saved_activation_bytes(_layer(**kw, **{f: True for f in FLAGS}), x, mask)
    tokens = 2 * 32
    assert base - sizes["normalize_invertible"] >= tokens * 32 * 4  # >= one LayerNorm input, fp32
    assert base - sizes["gelu_checkpoint"] >= tokens * 64 * 4  # the GeLU output
    assert base - sizes["attn_dropout_checkpoint"] >= 2 * 4 * 32 * 32 * 4  # the dropped probs
    assert every < min(sizes.values())


def test_stochastic_mode_is_the_same_layer_without_dropout_and_trains_with_it():
    x, mask = _inputs()
    base = _run(_layer(), x, mask)
    fast = _run(_layer(stochastic_mode=True), x, mask)
    _close(fast[0], base[0], 1e-6)
    _close(fast[1], base[1], 1e-6)
    layer = _layer(stochastic_mode=True, attn_dropout_ratio=0.3)
    out, gx, grads = _run(layer, x, mask)  # SDPA draws the attention dropout itself
    assert not torch.allclose(out, base[0]) and all(torch.isfinite(g).all() for g in grads.values())
    layer.eval()
    _close(layer(x, mask), base[0], 1e-6)


def test_return_tuple_eval_and_fp16_on_cpu():
    layer = _layer(return_tuple=True, attn_dropout_ratio=0.5, hidden_dropout_ratio=0.5, training=False)
    assert not layer.training
    x, mask = _inputs()
    a, = layer(x, mask)
    b, = layer(x, mask)
    _close(a, b, 0)  # eval: no dropout
    half = layer(x.detach().half(), mask.half())[0]
    assert half.dtype == torch.float16
    _close(half.float(), a.detach(), 2e-3)


def test_padding_mask_forms_agree():
    layer = _layer()
    x, mask = _inputs()
    keep = torch.ones(2, 16, dtype=torch.long)
    keep[1, -5:] = 0
    _close(layer(x, keep), layer(x, mask), 1e-5)
    _close(layer(x, keep.bool()[:, None, None, :]), layer(x, mask), 1e-5)


@pytest.mark.parametrize("kw,match", [
    (dict(hidden_size=30, heads=4), "divisible by heads"),
    (dict(hidden_size=-1), "hidden_size must be a positive int"),
    (dict(attn_dropout_ratio=1.0), "attn_dropout_ratio must be < 1"),
])
def test_bad_config_is_refused_naming_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        DeepSpeedTransformerLayer(_config(**kw))


def test_bad_inputs_are_refused():
    layer = _layer()
    with pytest.raises(ValueError, match=r"hidden_size=32\], got shape \(2, 16, 16\)"):
        layer(torch.randn(2, 16, 16))
    with pytest.raises(ValueError, match="dtype torch.int64 is not supported"):
        layer(torch.ones(2, 16, 32, dtype=torch.long))
    with pytest.raises(ValueError, match="attention_mask"):
        layer(torch.randn(2, 16, 32), torch.zeros(2, 16, 16, 1, 1))
    with pytest.raises(TypeError, match="unexpected keyword argument.*head_mask_typo"):
        layer(torch.randn(2, 16, 32), head_mask_typo=None)
    with pytest.raises(NotImplementedError, match="encoder_hidden_states"):
        layer(torch.randn(2, 16, 32), encoder_hidden_states=torch.randn(2, 16, 32))
    with pytest.raises(TypeError, match="DeepSpeedTransformerConfig"):
        DeepSpeedTransformerLayer({"hidden_size": 32})


def test_forcing_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    layer = _layer()
    layer.backend = "triton"
    with pytest.raises(RuntimeError, match="needs a CUDA tensor|triton is not installed"):
        layer(*_inputs())
    layer.backend = "fast"
    with pytest.raises(ValueError, match="backend 'fast' is not known"):
        layer(*_inputs())


@needs_triton
def test_triton_kernels_under_the_interpreter_equal_the_torch_path():
    run_checks("transformer_triton_checks", "cpu", interpret=True)


@needs_triton
@needs_cuda
@pytest.mark.gpu
def test_triton_kernels_on_gpu_equal_the_torch_path():
    run_checks("transformer_triton_checks", "cuda", interpret=False)


def test_auto_runs_the_torch_blocks_even_where_triton_could_run(monkeypatch):
    """``auto`` means the measured-faster torch blocks on a GPU too (see the module doc); the
    Triton kernels run only when asked for by name."""
    from deepspeed.ops.transformer import torch_ops, transformer

    asked = []
    answer = [True]  # as on a GPU with Triton
    monkeypatch.setattr(transformer, "use_triton", lambda *a: asked.append(a[1]) or answer[0])
    monkeypatch.delenv(transformer.BACKEND_ENV, raising=False)
    layer = _layer()
    x, _ = _inputs()
    assert layer._ops(x) is torch_ops and asked == []
    monkeypatch.setenv(transformer.BACKEND_ENV, "auto")
    assert layer._ops(x) is torch_ops and asked == []
    answer[0] = False  # leaves the Triton module unimported: only who decides is checked
    layer.backend = "triton"
    assert layer._ops(x) is torch_ops and asked == ["triton"]
