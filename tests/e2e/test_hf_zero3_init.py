"""ZeRO-3 `from_pretrained` (issue 9): with a stage-3 config alive, transformers builds the model
under our `deepspeed.zero.Init` and loads saved weights into the partitions; Trainer then trains
it. Also pins the two partition_parameters names transformers patches around that call."""
import json

import pytest
import torch

from test_cli import HERE, free_port, run, script

transformers = pytest.importorskip("transformers", reason="transformers is a dev extra")
pytest.importorskip("accelerate", reason="accelerate is a dev extra")


DS_CONFIG = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
             "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}


def save_tiny_gpt2(folder):
    torch.manual_seed(1)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(folder)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_trainer_from_pretrained_loads_into_partitions_and_trains(tmp_path):
    save_tiny_gpt2(tmp_path / "pretrained")
    out = run([script("deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()),
               str(HERE / "scripts" / "hf_init_zero3.py"), str(tmp_path / "pretrained"),
               str(tmp_path / "out"), "trainingargs"], timeout=300)
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert result["not_partitioned"] == [] and len(result["partitioned"]) == 28
    assert result["missing"] == [] and result["mismatch"] == []
    # wte is 64x32 = 2048 elements: each of 2 ranks holds half
    assert result["shard_sizes"]["transformer.wte.weight"] == 1024
    assert result["zero_stage"] == 3
    assert len(result["losses"]) == 3 and all(0 < loss < 10 for loss in result["losses"])


def load_under_hf_ds_config(folder):
    """Runs on each dist_pool rank: HfDeepSpeedConfig alone switches from_pretrained to zero.Init."""
    import deepspeed
    from transformers.integrations import HfDeepSpeedConfig

    hf_ds_config = HfDeepSpeedConfig(DS_CONFIG)  # noqa: F841 (transformers keeps a weak ref)
    model = transformers.GPT2LMHeadModel.from_pretrained(folder)
    params = dict(model.named_parameters())
    flags = {name: (hasattr(p, "ds_id") and hasattr(p, "ds_tensor") and p.data.numel() == 0)
             for name, p in params.items()}
    with deepspeed.zero.GatheredParameters(list(params.values())):
        full = {name: p.data.clone() for name, p in params.items()}
    return flags, full


def test_hf_deepspeed_config_from_pretrained_partitions_saved_weights(tmp_path, dist_pool):
    saved = save_tiny_gpt2(tmp_path / "pretrained")
    for flags, full in dist_pool.run(load_under_hf_ds_config, world_size=2,
                                     args=(str(tmp_path / "pretrained"),)):
        assert flags and all(flags.values()), flags
        for name, value in full.items():
            torch.testing.assert_close(value, saved[name], rtol=0, atol=0)


def build_under_init(use_hf_exemption):
    """Runs on a dist_pool rank: what dtype do buffers built inside Init(dtype=fp16) get?"""
    import deepspeed
    from transformers.integrations.deepspeed import prevent_arange_dtype_change

    class Rope(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.register_buffer("inv_freq", torch.arange(0, 4, 2, dtype=torch.float32))
            self.register_buffer("scale", torch.ones(4))

    if use_hf_exemption:
        with prevent_arange_dtype_change(), deepspeed.zero.Init(dtype=torch.float16):
            module = Rope()
    else:
        with deepspeed.zero.Init(dtype=torch.float16):
            module = Rope()
    untouched = torch.arange(3, dtype=torch.float32).dtype  # after exit: torch's own again
    return module.inv_freq.dtype, module.scale.dtype, module.proj.weight.dtype, untouched


@pytest.mark.parametrize("use_hf_exemption", [False, True])
def test_init_dtype_applies_to_constructors_and_transformers_can_exempt_arange(
        dist_pool, use_hf_exemption):
    from deepspeed.runtime.zero import partition_parameters as pp
    import deepspeed.zero.partition_parameters as impl

    assert pp is impl and pp._orig_torch_arange is torch.arange
    inv_freq, scale, weight, after = dist_pool.run(build_under_init, world_size=1,
                                                   args=(use_hf_exemption,))[0]
    assert scale == torch.float16 and weight == torch.float16 and after == torch.float32
    assert inv_freq == (torch.float32 if use_hf_exemption else torch.float16)
