"""``DeepSpeedInferenceConfig``: documented defaults, aliases, dtype spellings, deprecated keys,
and how ``init_inference`` merges a config with keyword arguments (single process, no group)."""
import json

import pytest
import torch

import deepspeed
from deepspeed.inference.config import DeepSpeedInferenceConfig, DtypeEnum


def test_documented_defaults():
    c = DeepSpeedInferenceConfig()
    assert c.replace_with_kernel_inject is False
    assert c.dtype is DtypeEnum.fp16 and c.dtype.torch_dtype is torch.float16
    assert c.tensor_parallel.enabled and c.tensor_parallel.tp_size == 1
    assert c.tensor_parallel.mpu is None and c.tensor_parallel.tp_group is None
    assert (c.enable_cuda_graph, c.use_triton, c.triton_autotune) == (False, False, False)
    assert c.zero == {} and c.triangular_masking is True
    assert c.moe.enabled and c.moe.ep_size == 1 and c.moe.moe_experts == [1]
    assert c.moe.type.value == "standard"
    assert c.quant.enabled and c.quant.weight.num_bits == 8 and c.quant.weight.q_groups == 1
    assert c.quant.activation.q_type.value == "symmetric"
    assert c.checkpoint is None and c.base_dir == "" and c.set_empty_params is False
    assert c.save_mp_checkpoint_path is None and c.checkpoint_config.checkpoint_dir is None
    assert c.return_tuple is True and c.training_mp_size == 1 and c.replace_method == "auto"
    assert c.injection_policy is None and c.injection_policy_tuple is None and c.config is None
    assert (c.max_out_tokens, c.min_out_tokens, c.transposed_mode) == (1024, 1, False)
    assert (c.mp_size, c.ep_size, c.moe_experts) == (1, 1, [1])


@pytest.mark.parametrize("alias, field, value", [
    ("kernel_inject", "replace_with_kernel_inject", True), ("tm", "triangular_masking", False),
    ("max_tokens", "max_out_tokens", 7), ("min_tokens", "min_out_tokens", 3),
    ("ckpt_config", "checkpoint_config", {"checkpoint_dir": "d"}),
    ("args", "config", {"a": 1}), ("injection_dict", "injection_policy", {torch.nn.Linear: ("x",)}),
])
def test_aliases_and_names_both_work(alias, field, value):
    for key in (alias, field):
        got = getattr(DeepSpeedInferenceConfig(**{key: value}), field)
        assert got == value or getattr(got, "checkpoint_dir", None) == "d"


def test_tp_alias_and_doc_example():
    c = DeepSpeedInferenceConfig(**{"kernel_inject": True, "tensor_parallel": {"tp_size": 4},
                                    "dtype": "fp16", "enable_cuda_graph": False})
    assert c.tensor_parallel.tp_size == 4 and c.replace_with_kernel_inject
    assert DeepSpeedInferenceConfig(tp={"tp_size": 2}).tensor_parallel.tp_size == 2


@pytest.mark.parametrize("spelling, member", [
    (torch.half, "fp16"), ("fp16", "fp16"), ("half", "fp16"), ("torch.float16", "fp16"),
    (torch.float, "fp32"), ("float", "fp32"), ("fp32", "fp32"), (torch.bfloat16, "bf16"),
    ("bf16", "bf16"), ("bfloat16", "bf16"), (torch.int8, "int8"), ("int8", "int8")])
def test_dtype_spellings(spelling, member):
    assert DeepSpeedInferenceConfig(dtype=spelling).dtype is DtypeEnum[member]


def test_bad_dtype_and_unknown_key_are_errors():
    with pytest.raises(ValueError, match="dtype"):
        DeepSpeedInferenceConfig(dtype=torch.float64)
    with pytest.raises(ValueError, match="tp_sise|extra"):
        DeepSpeedInferenceConfig(tp_sise=2)


def test_auto_is_dropped_except_replace_method():
    c = DeepSpeedInferenceConfig(dtype="auto", max_out_tokens="auto", replace_method="auto")
    assert c.dtype is DtypeEnum.fp16 and c.max_out_tokens == 1024 and c.replace_method == "auto"


def test_deprecated_keys_move_to_their_replacements():
    assert DeepSpeedInferenceConfig(mp_size=2).tensor_parallel.tp_size == 2
    c = DeepSpeedInferenceConfig(ep_size=2, moe_experts=[4], moe_type="residual")
    assert (c.moe.ep_size, c.moe.moe_experts, c.moe.type.value) == (2, [4], "residual")
    with pytest.raises(Exception, match="Cannot provide deprecated parameter 'mp_size'"):
        DeepSpeedInferenceConfig(mp_size=2, tensor_parallel={"tp_size": 2})
    assert DeepSpeedInferenceConfig(moe=True).moe.enabled


def test_init_inference_cases(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    reference = net(x)
    engine = deepspeed.init_inference(net)  # case 1: default fp16 kept fp32 on CPU
    assert isinstance(engine, deepspeed.inference.InferenceEngine) and engine.module is net
    assert torch.equal(engine(x), reference)
    assert torch.equal(deepspeed.init_inference(net, config={"dtype": torch.float})(x), reference)
    assert torch.equal(deepspeed.init_inference(net, dtype=torch.float,
                                                tensor_parallel={"tp_size": 1})(x), reference)
    assert torch.equal(deepspeed.init_inference(net, config={"dtype": torch.float},
                                                dtype=torch.float)(x), reference)
    with pytest.raises(ValueError, match="Conflicting argument 'dtype'"):
        deepspeed.init_inference(net, config={"dtype": torch.float}, dtype=torch.half)
    with pytest.raises(ValueError, match="expected string or dictionary"):
        deepspeed.init_inference(net, config=[("dtype", "fp32")])
    path = tmp_path / "inference.json"
    path.write_text(json.dumps({"dtype": "fp32", "tensor_parallel": {"tp_size": 1}}))
    engine = deepspeed.init_inference(net, config=str(path))
    assert engine.config.dtype is DtypeEnum.fp32 and torch.equal(engine(x), reference)


def test_explicit_dtypes_convert_and_kwargs_reach_the_module():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, scale=1.0):
            return self.lin(x) * scale

    net = Scaled()
    x = torch.randn(2, 4)
    want = net(x, scale=3.0)
    assert torch.equal(deepspeed.init_inference(net, dtype=torch.float)(x, scale=3.0), want)
    engine = deepspeed.init_inference(Scaled(), dtype=torch.bfloat16)
    assert engine.module.lin.weight.dtype is torch.bfloat16
    engine = deepspeed.init_inference(Scaled(), dtype="fp16")  # asked for: honoured
    assert engine.module.lin.weight.dtype is torch.float16
    engine = deepspeed.init_inference(Scaled(), dtype=torch.int8)  # weight-only int8
    assert engine.module.lin.parametrizations.weight.original0.dtype is torch.int8


def test_generate_passthrough_and_max_out_tokens():
    class Gen(torch.nn.Module):
        def forward(self, x):
            return x

        def generate(self, input_ids, max_new_tokens=1):
            return torch.cat([input_ids, input_ids[:, -1:].repeat(1, max_new_tokens)], dim=1)

    engine = deepspeed.init_inference(Gen(), dtype=torch.float, max_out_tokens=4)
    ids = torch.tensor([[1, 2, 3]])
    assert engine.generate(ids, max_new_tokens=2).tolist() == [[1, 2, 3, 3, 3]]
    with pytest.raises(RuntimeError, match="max_out_tokens=4"):
        engine.generate(torch.ones(1, 5, dtype=torch.long))


def test_without_the_plugin_the_error_names_it(monkeypatch):
    from deepspeed import plugin_manager

    installed = plugin_manager.installed_plugins()
    monkeypatch.setattr(plugin_manager, "installed_plugins",
                        lambda: {k: v for k, v in installed.items() if k != "inference"})
    with pytest.raises(plugin_manager.PluginError, match="'inference' plugin"):
        deepspeed.init_inference(torch.nn.Linear(2, 2))


def test_upstream_paths_resolve():
    from deepspeed.inference.auto_tp import AutoTP as Real
    from deepspeed.inference.config import DeepSpeedTPConfig  # noqa: F401
    from deepspeed.inference.engine import InferenceEngine  # noqa: F401
    from deepspeed.module_inject import AutoTP, LinearAllreduce, LinearLayer  # noqa: F401
    from deepspeed.module_inject import replace_transformer_layer  # noqa: F401
    from deepspeed.module_inject.auto_tp import AutoTP as Again
    from deepspeed.module_inject.layers import LinearAllreduce as LA  # noqa: F401

    assert AutoTP is Real is Again
