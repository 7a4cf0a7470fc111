"""``init_inference`` keys that had no effect before: ZeRO-Inference (``zero``), empty
parameters filled from a checkpoint (``set_empty_params``), ``min_out_tokens``,
``checkpoint_config``, activation and q/k/v quantization (``quant``), ``use_triton``, and the
keys without effect here warning once."""
import logging

import pytest
import torch

import deepspeed
from deepspeed.inference.quantize import dequantize, fake_quantize, int8_parts

from inference_models import build, input_ids


# ---------------------------------------------------------------------- zero (ZeRO-Inference)
def _zero_inference():
    model, _ = build("llama")
    ids = input_ids()
    with torch.no_grad():
        reference = model(ids).logits
    full = {n: p.numel() for n, p in model.named_parameters()}
    engine = deepspeed.init_inference(model, dtype=torch.float,
                                      zero={"stage": 3, "stage3_param_persistence_threshold": 0})
    shards = {n: p.ds_tensor.numel() for n, p in engine.module.named_parameters()}
    with torch.no_grad():
        got = engine(ids).logits
    engine.zero_engine.destroy()
    return (got - reference).abs().max().item(), full, shards


def test_zero_inference_partitions_the_parameters_and_computes_the_same(dist_pool):
    for diff, full, shards in dist_pool.run(_zero_inference, world_size=2):
        assert diff <= 1e-5
        assert set(shards) == set(full)
        assert all(shards[n] == -(-full[n] // 2) for n in full)  # each rank holds half
    with pytest.raises(ValueError, match="stage 3"):
        deepspeed.init_inference(torch.nn.Linear(4, 4), zero={"stage": 2})


# ---------------------------------------------------------------------- set_empty_params
def test_set_empty_params_takes_every_weight_from_the_checkpoint(tmp_path):
    torch.manual_seed(0)
    saved = torch.nn.Linear(4, 3)
    torch.save({"weight": saved.weight.detach()}, tmp_path / "no_bias.pt")  # bias left out
    torch.save(saved.state_dict(), tmp_path / "full.pt")
    kept = deepspeed.init_inference(torch.nn.Linear(4, 3), dtype=torch.float,
                                    checkpoint=str(tmp_path / "no_bias.pt"))
    assert kept.module.bias.device.type == "cpu"  # its own bias kept
    from deepspeed.inference.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="bias"):  # nothing of its own is kept
        deepspeed.init_inference(torch.nn.Linear(4, 3), dtype=torch.float,
                                 checkpoint=str(tmp_path / "no_bias.pt"), set_empty_params=True)
    filled = deepspeed.init_inference(torch.nn.Linear(4, 3), dtype=torch.float,
                                      checkpoint=str(tmp_path / "full.pt"), set_empty_params=True)
    assert torch.equal(filled.module.bias, saved.bias)
    with pytest.raises(ValueError, match="set_empty_params"):
        deepspeed.init_inference(torch.nn.Linear(4, 3), set_empty_params=True)


# ---------------------------------------------------------------------- min_out_tokens
def test_min_out_tokens_must_fit_within_max_out_tokens():
    model, _ = build("llama")
    with pytest.raises(ValueError, match="min_out_tokens"):
        deepspeed.init_inference(model, dtype=torch.float, max_out_tokens=8, min_out_tokens=9)
    ids = input_ids()
    length = ids.shape[-1]
    engine = deepspeed.init_inference(model, dtype=torch.float, max_out_tokens=length + 2,
                                      min_out_tokens=4)
    with pytest.raises(RuntimeError, match="min_out_tokens=4"):  # room for 2 new tokens only
        engine.generate(ids, max_new_tokens=1)
    shorter = ids[:, :length - 2]
    assert engine.generate(shorter, max_new_tokens=1, do_sample=False).shape[-1] == length - 1


# ---------------------------------------------------------------------- checkpoint_config
def test_checkpoint_config_names_the_checkpoint_and_its_directory(tmp_path):
    torch.manual_seed(0)
    saved = torch.nn.Linear(4, 3)
    torch.save(saved.state_dict(), tmp_path / "weights.pt")
    import json

    (tmp_path / "elsewhere").mkdir()
    descriptor = tmp_path / "elsewhere" / "ds.json"  # names weights.pt, relative to base_dir
    descriptor.write_text(json.dumps({"type": "ds_model", "version": 0.0,
                                      "checkpoints": ["weights.pt"]}))
    engine = deepspeed.init_inference(
        torch.nn.Linear(4, 3), dtype=torch.float,
        checkpoint_config={"checkpoint_dir": str(descriptor), "base_dir": str(tmp_path)})
    assert torch.equal(engine.module.weight, saved.weight)
    engine = deepspeed.init_inference(  # the split model (one rank here) and its descriptor
        torch.nn.Linear(4, 3), dtype=torch.float, checkpoint=str(tmp_path / "weights.pt"),
        checkpoint_config={"save_mp_checkpoint_path": str(tmp_path / "split")})
    assert engine.saved_checkpoint == str(tmp_path / "split" / "ds_inference_config.json")
    assert torch.equal(torch.load(tmp_path / "split" / "tp_rank_00.pt")["weight"], saved.weight)


# ---------------------------------------------------------------------- quant
def _int8(quant, module=None):
    torch.manual_seed(0)
    module = module if module is not None else torch.nn.Linear(8, 6)
    return deepspeed.init_inference(module, dtype=torch.int8, quant=quant)


def _weight(linear):
    codes, scale, zero = int8_parts(linear)
    return dequantize(codes, scale, zero)


@pytest.mark.parametrize("q_type", ["symmetric", "asymmetric"])
def test_activation_quantization_quantizes_each_layer_input(q_type):
    x = torch.randn(5, 8)
    both = _int8({"activation": {"q_type": q_type, "q_groups": 2, "num_bits": 4}})
    quantized_x = fake_quantize(x, 4, 2, q_type == "symmetric")
    assert not torch.equal(quantized_x, x)
    want = torch.nn.functional.linear(quantized_x, _weight(both.module), both.module.bias)
    assert torch.equal(both(x), want)
    weight_only = _int8({"activation": {"enabled": False}})
    want = torch.nn.functional.linear(x, _weight(weight_only.module), weight_only.module.bias)
    assert torch.equal(weight_only(x), want)
    # quant.weight off: float weights, quantized inputs; quant off: the float model
    inputs_only = _int8({"weight": {"enabled": False}})
    assert int8_parts(inputs_only.module) is None and inputs_only.quantized == {}
    want = torch.nn.functional.linear(fake_quantize(x), inputs_only.module.weight,
                                      inputs_only.module.bias)
    assert torch.equal(inputs_only(x), want)
    plain = _int8({"enabled": False})
    assert int8_parts(plain.module) is None
    assert torch.equal(plain(x), torch.nn.functional.linear(x, plain.module.weight,
                                                            plain.module.bias))


def test_qkv_off_leaves_the_attention_projections_in_float():
    def attention():
        torch.manual_seed(0)
        return torch.nn.ModuleDict({name: torch.nn.Linear(8, 8)
                                    for name in ("q_proj", "k_proj", "v_proj", "o_proj")})

    assert set(_int8({}, attention()).quantized) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert set(_int8({"qkv": {"enabled": False}}, attention()).quantized) == {"o_proj"}


# ---------------------------------------------------------------------- use_triton
def test_use_triton_needs_kernel_injection_and_a_cuda_device():
    with pytest.raises(ValueError, match="replace_with_kernel_inject"):
        deepspeed.init_inference(torch.nn.Linear(4, 4), use_triton=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA device"):
            deepspeed.init_inference(torch.nn.Linear(4, 4), use_triton=True,
                                     replace_with_kernel_inject=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_use_triton_runs_the_injected_bias_gelu_in_triton(monkeypatch):
    from deepspeed.inference import triton_bias_gelu as kernel

    calls = []
    original = kernel.triton_bias_gelu
    monkeypatch.setattr(kernel, "triton_bias_gelu",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    outputs = {}
    for use_triton in (False, True):
        model, _ = build("gpt_neox")
        engine = deepspeed.init_inference(model.cuda().half(), dtype=torch.half,
                                          replace_with_kernel_inject=True, use_triton=use_triton)
        with torch.no_grad():
            outputs[use_triton] = engine(input_ids().cuda()).logits.float()
        if not use_triton:
            assert calls == []  # eager PyTorch bias + GeLU
    assert calls  # the Triton kernel ran
    scale = outputs[False].abs().max().item()
    assert (outputs[True] - outputs[False]).abs().max().item() <= 1e-2 * scale


# ---------------------------------------------------------------------- warned keys
@pytest.mark.parametrize("key, value, named", [
    ("triton_autotune", True, "triton_autotune"),
    ("triangular_masking", False, "triangular_masking"),
    ("return_tuple", False, "return_tuple"), ("replace_method", "layer", "replace_method"),
    ("transposed_mode", True, "transposed_mode"),
    ("args", {"hidden_size": 4}, "config"),  # `config` is init_inference's own argument
    ("quant", {"weight": {"quantized_initialization": {"x": 1}}},
     "quant.weight.quantized_initialization"),
    ("quant", {"weight": {"post_init_quant": {"x": 1}}}, "quant.weight.post_init_quant"),
    ("moe", {"ep_group": object()}, "moe.ep_group"),
    ("moe", {"ep_mp_group": object()}, "moe.ep_mp_group"),
])
def test_keys_without_effect_here_warn_once_naming_themselves(caplog, key, value, named):
    from deepspeed.config.without_effect import reset_without_effect_warnings

    reset_without_effect_warnings()
    logger = logging.getLogger("DeepSpeed")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="DeepSpeed"):
            deepspeed.init_inference(torch.nn.Linear(4, 4), dtype=torch.float, **{key: value})
    finally:
        logger.removeHandler(caplog.handler)
        reset_without_effect_warnings()
    warned = [r.getMessage() for r in caplog.records if "has no effect here" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"init_inference.{named} "), warned


# ---------------------------------------------------------------------- tensor_parallel / moe
def _split_over(how):
    from deepspeed import comm as dist

    model, _ = build("llama")
    if how == "tp_group":
        group = dist.new_group(ranks=[0, 1])
        engine = deepspeed.init_inference(model, dtype=torch.float,
                                          tensor_parallel={"tp_size": 2, "tp_group": group})
        return engine.mp_group is group, engine.mp_world_size
    if how in ("mpu", "deprecated mpu"):
        group = dist.new_group(ranks=[0, 1])

        class MPU:
            def get_model_parallel_group(self):
                return group

            def get_model_parallel_rank(self):
                return dist.get_rank()

        if how == "mpu":
            engine = deepspeed.init_inference(model, dtype=torch.float,
                                              tensor_parallel={"tp_size": 2, "mpu": MPU()})
        else:
            engine = deepspeed.init_inference(model, dtype=torch.float, mp_size=2, mpu=MPU())
        return engine.mp_group is group, engine.mp_world_size
    engine = deepspeed.init_inference(model, dtype=torch.float,
                                      tensor_parallel={"tp_size": 2, "enabled": False})
    return engine.mp_group is None, engine.mp_world_size


@pytest.mark.parametrize("how", ["tp_group", "mpu", "deprecated mpu"])
def test_tensor_parallel_group_comes_from_tp_group_or_mpu(dist_pool, how):
    assert dist_pool.run(_split_over, world_size=2, args=(how,)) == [(True, 2)] * 2


def test_tensor_parallel_enabled_false_splits_nothing(dist_pool):
    assert dist_pool.run(_split_over, world_size=2, args=("enabled",)) == [(True, 1)] * 2


def test_moe_enabled_false_asks_for_no_expert_parallelism():
    deepspeed.init_inference(torch.nn.Linear(4, 4), dtype=torch.float,
                             moe={"enabled": False, "ep_size": 2})  # nothing to place
    with pytest.raises(ValueError, match="moe.ep_size=2"):
        deepspeed.init_inference(torch.nn.Linear(4, 4), dtype=torch.float,
                                 moe={"enabled": True, "ep_size": 2})


def test_weight_q_type_asymmetric_keeps_zero_points():
    symmetric = _int8({"activation": {"enabled": False}})
    asymmetric = _int8({"activation": {"enabled": False}, "weight": {"q_type": "asymmetric"}})
    assert int8_parts(symmetric.module)[2] is None
    assert int8_parts(asymmetric.module)[2] is not None


def _policy_split(policy):
    from inference_models import block_class

    model, _ = build("llama")
    kwargs = {} if policy is None else {"injection_policy": {block_class(model): policy}}
    engine = deepspeed.init_inference(model, dtype=torch.float, tensor_parallel={"tp_size": 2},
                                      **kwargs)
    layer = engine.module.model.layers[0]
    return type(layer.self_attn.o_proj).__name__, type(layer.mlp.down_proj).__name__


def test_injection_policy_names_the_row_parallel_layers(dist_pool):
    autotp = dist_pool.run(_policy_split, world_size=2, args=(None,))[0]
    named = dist_pool.run(_policy_split, world_size=2, args=(("self_attn.o_proj",),))[0]
    assert autotp[0] == autotp[1] == named[0]  # AutoTP's row-parallel kind
    assert named[1] != autotp[1]  # down_proj left out of the policy: not row-parallel


def test_weight_q_groups_gives_a_scale_per_group():
    grouped = _int8({"activation": {"enabled": False}, "weight": {"q_groups": 4}})
    assert int8_parts(grouped.module)[1].shape == (6, 4)  # 6 output rows x 4 groups
