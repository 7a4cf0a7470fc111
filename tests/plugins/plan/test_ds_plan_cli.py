"""``ds_plan`` in-process: a search prints the ranked table and writes the best layout as a
config that ``deepspeed.initialize`` trains with on two ranks; one layout from a config;
bad input fails with the flag named."""
import json

import torch

from deepspeed.plan import cluster, describe_model, search
from deepspeed.plan.cli import main

SEARCH = ["--model", "tiny-llama", "--seq-len", "32", "--cluster", "cpu-local",
          "--gpus-per-node", "2", "--precision", "fp32", "--max-tp", "1", "--max-pp", "1",
          "--max-sp", "1"]


def _train_with(config):
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    losses = []
    for _ in range(engine.gradient_accumulation_steps()):
        loss = engine(torch.randn(engine.train_micro_batch_size_per_gpu(), 8)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    stage = engine.zero_optimization_stage()
    engine.destroy()
    return stage, engine.global_steps, losses


def test_search_table_and_written_config_trains(tmp_path, capsys, dist_pool):
    out = tmp_path / "best.json"
    assert main(SEARCH + ["--global-batch", "8", "--top", "5", "--write-config", str(out)]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line[:3].strip().isdigit()]
    assert 1 <= len(rows) <= 5 and "tokens/s" in text and f"wrote {out}" in text
    config = json.loads(out.read_text())
    assert config["train_batch_size"] == 8
    for stage, steps, losses in dist_pool.run(_train_with, args=(config,)):
        assert stage == config["zero_optimization"]["stage"]
        assert steps == 1 and all(loss == loss for loss in losses)


def test_search_ranks_fitting_layouts_by_throughput():
    spec = describe_model("tiny-llama", seq_len=32)
    hw = cluster("cpu-local", gpus_per_node=2)
    found = search(spec, hw, global_batch=8, top=50, precision="fp32")
    assert found and all(e.fits for e in found)
    speeds = [e.tokens_per_s for e in found]
    assert speeds == sorted(speeds, reverse=True)
    assert all(e.layout.world_size == 2 and e.layout.global_batch == 8 for e in found)
    small = cluster("cpu-local", gpus_per_node=2, gpu_memory=found[0].memory.peak - 1)
    assert all(e.memory.peak < found[0].memory.peak
               for e in search(spec, small, global_batch=8, top=50, precision="fp32"))


def test_one_layout_from_a_config(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
                                "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}))
    assert main(SEARCH + ["--config", str(path)]) == 0
    text = capsys.readouterr().out
    assert "dp2 z3" in text and "2x2" in text


def test_bad_input_names_the_flag(capsys):
    assert main(SEARCH) == 2
    assert "--global-batch is required" in capsys.readouterr().err
    assert main(SEARCH + ["--layout", "dp=2,zero=3"]) == 2
    assert "unknown key 'zero'" in capsys.readouterr().err
