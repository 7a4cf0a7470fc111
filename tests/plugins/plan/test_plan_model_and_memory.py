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


def test_moe_layers_are_described_and_split_over_expert_ranks():
    """A ``deepspeed.moe.layer.MoE`` built with every expert local: the spec knows its experts,
    gate and capacity, an ep=2 layout keeps half the expert weights per rank, and the
    all-to-alls carry every capacity slot (the empty ones too: min_capacity)."""
    from deepspeed.moe.layer import MoE
    from deepspeed.plan.comms import by_name_and_size, per_step

    width = 8
    expert = torch.nn.Sequential(torch.nn.Linear(width, 16), torch.nn.ReLU(),
                                 torch.nn.Linear(16, width))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width),
                                MoEOutput(MoE(width, expert, num_experts=4, k=1, min_capacity=3)))
    spec = from_module(model, (torch.randn(1, 6, width),), name="moe")
    per_expert = width * 16 + 16 + 16 * width + width
    assert (spec.num_experts, spec.experts_per_token, spec.expert_layers) == (4, 1, 1)
    assert spec.expert_params == 4 * per_expert and sum(spec.expert_mask) == 4 * 4
    dense = spec.total_params - spec.expert_params
    layout = Layout(dp=2, ep=2, micro_batch=2, precision="fp32")
    plan = memory_per_rank(spec, layout, cluster("cpu-local"))
    assert plan.params == (dense + 2 * per_expert) * 4
    comms = by_name_and_size(per_step(spec, layout))
    # 12 tokens over 4 experts: 3 slots each; with min_capacity 4 the slots would be 4
    assert comms["all_to_all_single"] == {4 * 3 * width * 4: 4}
    assert comms["all_reduce"] == {dense * 4: 1, 2 * per_expert * 4: 1}
    fewer = Layout(dp=2, ep=2, micro_batch=1, precision="fp32")  # 6 tokens: 2 each, min 3
    assert by_name_and_size(per_step(spec, fewer))["all_to_all_single"] == {4 * 3 * width * 4: 4}


class MoEOutput(torch.nn.Module):
    """The MoE layer's output alone (it returns output, l_aux, exp_counts)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)[0]


def test_peak_reads_offload_mixed_precision_and_reduction_timing():
    """The measured rules (docs/dev/benchmarks.md) on a model whose bucket holds it whole:
    stage 0 reduces after backward (the larger of activations and the flat copy, not their
    sum); ZeRO-1/2 step 12 / 10 / 14 bytes per partition element in fp32 / bf16 / fp16 above
    weights and optimizer state; an offloaded optimizer's step counts on the host, which
    ``unified_peak`` adds for a machine whose host and accelerator are one memory."""
    spec = from_module(mlp(), (torch.randn(1, 16),))
    count, cpu = spec.total_params, cluster("cpu-local")
    stage0 = memory_per_rank(spec, Layout(dp=2, precision="fp32"), cpu)
    assert stage0.peak == 16 * count + max(stage0.activations, 4 * count)
    half = -(-count // 2)
    for precision, weight, step in (("fp32", 4, 12), ("bf16", 2, 10), ("fp16", 2, 14)):
        plan = memory_per_rank(spec, Layout(dp=2, zero_stage=2, precision=precision), cpu)
        assert plan.step_transient == step * half
        assert plan.peak >= weight * count + 16 * half + step * half
    offload = memory_per_rank(spec, Layout(dp=2, zero_stage=2, precision="fp32",
                                           offload_optimizer="cpu"), cpu)
    assert (offload.step_transient, offload.host_step_transient) == (0, 12 * half)
    assert offload.host == 16 * half and offload.peak == offload.backward_peak
    assert offload.unified_peak == max(offload.backward_peak, 4 * count + 12 * half) + 16 * half
