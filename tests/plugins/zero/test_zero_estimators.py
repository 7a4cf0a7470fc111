"""ZeRO memory estimators: the printed tables must reproduce the documented examples digit for
digit (DeepSpeed "Memory Requirements" doc and the HF DeepSpeed integration doc)."""
import pytest
import torch

from deepspeed.zero.estimators import (GB, estimate_zero2_model_states_mem_needs,
                                       estimate_zero2_model_states_mem_needs_all_cold,
                                       estimate_zero2_model_states_mem_needs_all_live,
                                       estimate_zero3_model_states_mem_needs,
                                       estimate_zero3_model_states_mem_needs_all_cold,
                                       estimate_zero3_model_states_mem_needs_all_live, model_param_counts)

# Copied from the DeepSpeed docs (ZeRO-2, all_cold, t5-3b on 1 node x 8 GPUs); the doc's rendering
# collapsed the column padding, so rows are compared with whitespace runs normalised.
ZERO2_T5_3B_8GPUS = """\
Estimated memory needed for params, optim states and gradients for a:
HW: Setup with 1 node, 8 GPUs per node.
SW: Model with 2851M total params.
per CPU | per GPU | Options
127.45GB | 5.31GB | offload_optimizer=cpu
127.45GB | 15.93GB | offload_optimizer=none
"""

# Copied verbatim from the HF integration doc (bigscience/T0_3B), spacing included.
ZERO3_T0_3B_1GPU = """\
Estimated memory needed for params, optim states and gradients for a:
HW: Setup with 1 node, 1 GPU per node.
SW: Model with 2783M total params, 65M largest layer params.
  per CPU  |  per GPU |   Options
   70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
   70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
   62.23GB |   5.43GB | offload_param=none, offload_optimizer=cpu , zero_init=1
   62.23GB |   5.43GB | offload_param=none, offload_optimizer=cpu , zero_init=0
    0.37GB |  46.91GB | offload_param=none, offload_optimizer=none, zero_init=1
   15.56GB |  46.91GB | offload_param=none, offload_optimizer=none, zero_init=0
"""

ZERO3_T0_3B_2GPUS = """\
Estimated memory needed for params, optim states and gradients for a:
HW: Setup with 1 node, 2 GPUs per node.
SW: Model with 2783M total params, 65M largest layer params.
  per CPU  |  per GPU |   Options
   70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
   70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
   62.23GB |   2.84GB | offload_param=none, offload_optimizer=cpu , zero_init=1
   62.23GB |   2.84GB | offload_param=none, offload_optimizer=cpu , zero_init=0
    0.74GB |  23.58GB | offload_param=none, offload_optimizer=none, zero_init=1
   31.11GB |  23.58GB | offload_param=none, offload_optimizer=none, zero_init=0
"""

# DeepSpeed docs, ZeRO-3 all_cold for t5-3b (2851e6 / 32e6) on 8 GPUs; padding collapsed there too.
ZERO3_T5_3B_8GPUS_ROWS = """\
71.69GB | 0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
127.45GB | 0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
63.72GB | 0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1
127.45GB | 0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0
1.43GB | 6.09GB | offload_param=none, offload_optimizer=none, zero_init=1
127.45GB | 6.09GB | offload_param=none, offload_optimizer=none, zero_init=0
"""

T0_3B_TOTAL, T0_3B_LARGEST = 2_783_960_000, 32128 * 2048


def squeeze(text: str):
    return [" ".join(line.split()) for line in text.strip().splitlines()]


def test_zero2_all_cold_matches_the_doc_table(capsys):
    estimate_zero2_model_states_mem_needs_all_cold(total_params=2851e6, num_gpus_per_node=8, num_nodes=1)
    assert squeeze(capsys.readouterr().out) == squeeze(ZERO2_T5_3B_8GPUS)


@pytest.mark.parametrize("gpus,expected", [(1, ZERO3_T0_3B_1GPU), (2, ZERO3_T0_3B_2GPUS)])
def test_zero3_all_cold_matches_the_hf_doc_tables_exactly(capsys, gpus, expected):
    estimate_zero3_model_states_mem_needs_all_cold(total_params=T0_3B_TOTAL, largest_layer_params=T0_3B_LARGEST,
                                                   num_gpus_per_node=gpus, num_nodes=1)
    assert capsys.readouterr().out == expected


def test_zero3_all_cold_matches_the_deepspeed_doc_rows(capsys):
    estimate_zero3_model_states_mem_needs_all_cold(total_params=2851e6, largest_layer_params=32e6,
                                                   num_gpus_per_node=8, num_nodes=1)
    out = squeeze(capsys.readouterr().out)
    assert out[1:3] == ["HW: Setup with 1 node, 8 GPUs per node.",
                        "SW: Model with 2851M total params, 32M largest layer params."]
    assert out[4:] == squeeze(ZERO3_T5_3B_8GPUS_ROWS)


def test_zero2_formulas_from_the_doc():
    total, gpus, nodes = 10**9, 4, 2
    cpu, gpu = estimate_zero2_model_states_mem_needs(total, gpus, nodes, cpu_offload=True)
    assert (cpu, gpu) == (int(total * max(4 * gpus, 16) * 1.5), 2 * total)
    cpu, gpu = estimate_zero2_model_states_mem_needs(total, gpus, nodes, cpu_offload=False,
                                                     additional_buffer_factor=1.0)
    assert (cpu, gpu) == (total * 4 * gpus, 4 * total + 16 * total // (gpus * nodes))


def test_zero3_formulas_from_the_doc():
    total, largest, gpus, nodes = 8 * 10**8, 10**7, 4, 2
    layer = 4 * largest
    assert estimate_zero3_model_states_mem_needs(total, largest, gpus, nodes) == \
        (int(total * 18 / nodes * 1.5), layer, layer)
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(total, largest, gpus, nodes, cpu_offload_params=False,
                                                        zero_init=False)
    assert (cpu, gpu) == (int(total * max(4 * gpus, 16 / nodes) * 1.5), layer + 2 * total // (gpus * nodes))
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(total, largest, gpus, nodes, cpu_offload=False,
                                                        cpu_offload_params=False)
    assert (cpu, gpu) == (int(largest * 4 * gpus * 1.5), layer + 18 * total // (gpus * nodes))


class TiedToy(torch.nn.Module):
    """Embedding (50x8=400) tied with the output head; a wider hidden layer (8x30+30=270)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 30), torch.nn.ReLU(), torch.nn.Linear(30, 8))
        self.head = torch.nn.Linear(8, 50, bias=False)
        self.head.weight = self.embed.weight


def test_all_live_counts_tied_weights_once_and_finds_the_largest_layer(capsys):
    model = TiedToy()
    expected_total = 400 + (8 * 30 + 30) + (30 * 8 + 8)
    assert model_param_counts(model) == (expected_total, 400)
    expected_total = sum(p.numel() for p in model.parameters())  # torch dedupes the tied Parameter too
    assert model_param_counts(model)[0] == expected_total

    estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=2)
    live = capsys.readouterr().out
    estimate_zero3_model_states_mem_needs_all_cold(expected_total, 400, num_gpus_per_node=2)
    assert live == capsys.readouterr().out

    estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=2)
    live = capsys.readouterr().out
    estimate_zero2_model_states_mem_needs_all_cold(expected_total, num_gpus_per_node=2)
    assert live == capsys.readouterr().out


def test_tensors_sharing_storage_count_once():
    shared = torch.nn.Module()
    weight = torch.nn.Parameter(torch.zeros(6, 4))
    shared.a = torch.nn.Linear(4, 6, bias=False)
    shared.b = torch.nn.Linear(4, 6, bias=False)
    shared.a.weight = weight
    shared.b.weight = torch.nn.Parameter(weight.data)  # distinct Parameter, same storage
    assert model_param_counts(shared) == (24, 24)


def test_meta_device_models_are_counted_by_identity():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 5))
    assert model_param_counts(model) == (10 * 20 + 20 + 20 * 5 + 5, 220)


def test_multi_node_header_and_gb_unit(capsys):
    estimate_zero3_model_states_mem_needs_all_cold(GB, 0, num_gpus_per_node=1, num_nodes=2,
                                                   additional_buffer_factor=1.0)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "HW: Setup with 2 nodes, 1 GPU per node."
    # cpu+cpu with zero_init: 18 bytes/param over 2 nodes = 9 GB per node; nothing on the GPU
    assert lines[4] == "    9.00GB |   0.00GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1"


@pytest.mark.parametrize("kwargs,name", [({"num_gpus_per_node": 0}, "num_gpus_per_node"),
                                         ({"num_nodes": 1.5}, "num_nodes"),
                                         ({"additional_buffer_factor": 0}, "additional_buffer_factor")])
def test_bad_setup_is_rejected_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        estimate_zero2_model_states_mem_needs_all_cold(10**6, **kwargs)
