"""The planner's model description and memory arithmetic, in one process without ranks:
traced figures are the same on meta and on real tensors, a transformers config extrapolated
from one and two layers equals the model built whole, and the ZeRO-2/3 model-state numbers
are the documented estimators' to the digit (their printed tables included)."""
import contextlib
import io
import re

import pytest
import torch

from deepspeed.plan import Layout, cluster, from_module, from_transformers, memory_per_rank
from deepspeed.plan.cluster import GB
from deepspeed.plan.model_spec import ModelSpec, hf_config, trace_forward
from deepspeed.zero import (estimate_zero2_model_states_mem_needs_all_cold,
                            estimate_zero3_model_states_mem_needs_all_cold)


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def test_trace_on_meta_equals_trace_on_real_tensors():
    torch.manual_seed(0)
    real = trace_forward(mlp(), (torch.randn(3, 16),))
    with torch.device("meta"):
        meta = trace_forward(mlp(), (torch.randn(3, 16),))
    assert real == meta
    # saved for backward: the first Linear's input (3x16), its output (GELU's input, 3x32),
    # GELU's output (the second Linear's input, 3x32); the weights are not activations
    assert real[0] == (3 * 16 + 3 * 32 + 3 * 32) * 4
    # the flops profiler: two FLOPs per multiply-add of the Linears, one per GELU element
    assert real[1] == 2 * 3 * (16 * 32 + 32 * 4) + 3 * 32


def module_and_inputs():
    """What ``ds_plan --model test_plan_model_and_memory:module_and_inputs`` calls."""
    return mlp(), (torch.randn(1, 16),)


def test_module_function_is_built_on_meta():
    from deepspeed.plan import load_model

    spec = load_model(f"{__name__}:module_and_inputs")
    assert spec.total_params == 16 * 32 + 32 + 32 * 4 + 4
    assert spec.param_numels == (16 * 32, 32, 32 * 4, 4)
    assert spec.activation_bytes == (16 + 32 + 32) * 4
    with pytest.raises(ValueError, match="has no 'missing'"):
        load_model(f"{__name__}:missing")


def test_transformers_config_extrapolates_to_the_whole_model():
    from transformers import AutoModelForCausalLM

    values = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    planned = from_transformers(values, seq_len=8)
    config = hf_config(values)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        whole = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    ids = torch.zeros(1, 8, dtype=torch.long, device="meta")
    act, flops = trace_forward(whole, (ids,), lambda out: out.logits.float().sum(), flash_seq_len=8)
    assert planned.total_params == sum(p.numel() for p in whole.parameters())
    assert planned.param_numels == tuple(p.numel() for p in whole.parameters())
    assert (planned.activation_bytes, planned.flops_per_sample) == (act, flops)
    assert planned.num_layers == 4 and planned.hidden_size == 32


def test_flash_attention_reading_drops_the_quadratic_matrix():
    values = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=4, vocab_size=100)
    short, long = (from_transformers(values, seq_len=s).activation_bytes for s in (64, 128))
    assert long == 2 * short  # linear in the sequence, no s^2 term


SPEC = ModelSpec(name="7b-like", total_params=6_738_415_616, largest_layer_params=131_072_000,
                 num_layers=32, hidden_size=4096, seq_len=2048, activation_bytes=0,
                 layer_input_bytes=0, flops_per_sample=0, num_heads=32)


def _printed_gpu_column(printer, *args):
    """{options text: per-GPU GB text} of an estimator's printed table."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        printer(*args)
    rows = re.findall(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.+)$", out.getvalue(), re.M)
    return {options.strip(): gpu for _, gpu, options in rows}


@pytest.mark.parametrize("nodes,gpus", [(1, 8), (4, 8), (2, 1)])
def test_zero2_and_zero3_model_states_are_the_estimators_to_the_digit(nodes, gpus):
    hw = cluster("dgx-h100", nodes=nodes, gpus_per_node=gpus)
    z2 = _printed_gpu_column(estimate_zero2_model_states_mem_needs_all_cold, SPEC.total_params, gpus, nodes)
    z3 = _printed_gpu_column(estimate_zero3_model_states_mem_needs_all_cold, SPEC.total_params,
                             SPEC.largest_layer_params, gpus, nodes)
    world = nodes * gpus
    for offload, row in (("none", "offload_optimizer=none"), ("cpu", "offload_optimizer=cpu")):
        plan = memory_per_rank(SPEC, Layout(dp=world, zero_stage=2, offload_optimizer=offload), hw)
        assert f"{plan.model_states / GB:6.2f}".strip() == z2[row]
    for param, opt in (("cpu", "cpu"), ("none", "cpu"), ("none", "none")):
        plan = memory_per_rank(SPEC, Layout(dp=world, zero_stage=3, offload_optimizer=opt,
                                            offload_param=param), hw)
        row = f"offload_param={param:4}, offload_optimizer={opt:4}, zero_init=1"
        assert f"{plan.model_states / GB:6.2f}".strip() == z3[row]


def test_each_stage_and_option_moves_memory_where_it_says():
    hw = cluster("dgx-h100", nodes=1)
    spec = ModelSpec(name="x", total_params=8_000_000, largest_layer_params=1_000_000, num_layers=8,
                     hidden_size=512, seq_len=1024, activation_bytes=80_000_000,
                     layer_input_bytes=1_048_576, flops_per_sample=1, num_heads=8)
    states = [memory_per_rank(spec, Layout(dp=8, zero_stage=s), hw).model_states for s in range(4)]
    # the documented ZeRO-2 figure keeps 16-bit gradients whole, so it equals stage 1's
    assert states == sorted(states, reverse=True) and states[3] < states[2] < states[0]
    plain = memory_per_rank(spec, Layout(dp=8, zero_stage=1), hw)
    offloaded = memory_per_rank(spec, Layout(dp=8, zero_stage=1, offload_optimizer="cpu"), hw)
    assert offloaded.optimizer == 0 and offloaded.host == plain.optimizer
    checkpointed = memory_per_rank(spec, Layout(dp=8, activation_checkpointing=True), hw)
    assert checkpointed.activations < plain.activations
    assert memory_per_rank(spec, Layout(dp=4, tp=2), hw).activations == plain.activations // 2
    # sequence-parallel ranks hold the same weights: ZeRO partitions over dp x sp, and each
    # keeps its share of the sequence's activations
    ulysses = memory_per_rank(spec, Layout(dp=4, sp=2, zero_stage=3), hw)
    assert ulysses.model_states == memory_per_rank(spec, Layout(dp=8, zero_stage=3), hw).model_states
    assert ulysses.activations == plain.activations // 2


@pytest.mark.parametrize("bad,message", [
    (dict(dp=4, ep=3), "ep=3 must divide dp=4"),
    (dict(zero_stage=0, offload_optimizer="cpu"), "offload_optimizer needs ZeRO"),
    (dict(zero_stage=2, offload_param="cpu"), "offload_param needs ZeRO stage 3"),
    (dict(precision="fp8"), "precision 'fp8'"),
    (dict(pp=2, zero_stage=2), "pipeline parallelism runs with ZeRO stage 0 or 1"),
])
def test_bad_layouts_name_the_offending_value(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Layout(**bad)


def test_unknown_presets_list_what_exists():
    with pytest.raises(ValueError, match="dgx-h100"):
        cluster("dgx-h900")
    with pytest.raises(ValueError, match="llama-70b"):
        hf_config("no-such-model-anywhere")
