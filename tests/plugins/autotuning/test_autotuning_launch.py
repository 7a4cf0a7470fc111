"""``deepspeed --autotuning`` end to end on CPU ranks: a tiny search over the demo GPT (2 stages
at one micro-batch size, 2 measured steps) profiles the model, measures each experiment as its
own 2-rank job, writes the per-stage summary and the best config, and in ``run`` mode trains
with it; experiments that all fail are one error naming every log."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEMO = os.path.join(REPO, "examples", "train_demo.py")
EXAMPLE_CONFIG = os.path.join(REPO, "examples", "autotuning", "ds_config.json")


def _deepspeed(args, cwd, timeout=580):
    return subprocess.run([sys.executable, "-m", "deepspeed.launcher.runner"] + args, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.timeout(600)  # 3 two-rank jobs: about a minute, far more on a loaded machine
def test_tune_on_the_demo_gpt(tmp_path):
    """The README's autotuning example (examples/autotuning/ds_config.json: fast mode, profile
    window 2-4), its search narrowed to ZeRO 0 and 1 at micro-batch 4 under the grid tuner; this
    is the example's test (tests/e2e/test_examples.py names it)."""
    config = json.loads(open(EXAMPLE_CONFIG).read())
    config.update({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": [0, 1]}})
    config["autotuning"]["tuner_type"] = "gridsearch"  # every point of the 2-experiment space
    (tmp_path / "ds_config.json").write_text(json.dumps(config))
    out = _deepspeed(["--autotuning", "tune", "--num_gpus", "2", DEMO,
                      "--deepspeed_config", "ds_config.json", "--steps", "6"], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    results = tmp_path / "autotuning_results"
    summary = json.loads((results / "summary.json").read_text())
    assert list(summary["tuning_spaces"]) == ["z0", "z1", "global"]
    names = {r["name"] for r in summary["experiments"]}
    assert names == {"z0_gas1_tmbspg4", "z1_gas1_tmbspg4"}
    measured = {r["name"]: r["metric_value"] for r in summary["experiments"]}
    assert None not in measured.values(), summary["experiments"]
    best = summary["tuning_spaces"]["global"]["best_exp_name"]
    assert best in names and measured[best] == max(measured.values()) > 0
    for stage in ("z0", "z1"):
        assert summary["tuning_spaces"][stage]["num_experiments"] == 1
    for name in names:  # measured by the engine's timers over the profile window
        metrics = next(r["metrics"] for r in summary["experiments"] if r["name"] == name)
        window = config["autotuning"]["end_profile_step"] - config["autotuning"]["start_profile_step"]
        assert metrics["measured_steps"] == window == 2 and metrics["train_batch_size"] == 8
        # the slowest rank's forward + backward + step; rank 0's phases are one of them
        assert metrics["latency"] >= sum(metrics["phases_ms"].values()) * (1 - 1e-9) > 0
    assert sorted(os.listdir(tmp_path / "autotuning_exps")) == \
        ["profile_model_info.json", "z0_gas1_tmbspg4.json", "z1_gas1_tmbspg4.json"]
    info = json.loads((results / "profile_model_info" / "model_info.json").read_text())
    assert info["num_params"] == 104192 and info["activation_mem_per_sample"] > 0
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    assert optimal["zero_optimization"]["stage"] == int(best[1])
    assert optimal["train_micro_batch_size_per_gpu"] == 4 and optimal["train_batch_size"] == 8
    assert optimal["autotuning"] == config["autotuning"]  # experiment keys gone again
    assert "wall_clock_breakdown" not in optimal and "steps_per_print" not in optimal
    cmd = (results / "cmd_optimal.txt").read_text()
    assert "ds_config_optimal.json" in cmd and "--autotuning" not in cmd
    assert (results / "summary.png").read_bytes().startswith(b"\x89PNG")  # matplotlib: dev
    text = (results / "summary.txt").read_text()
    assert text.splitlines()[0].startswith("| tuning_space") and "| global" in text
    # progress while running, then the table
    assert "[autotuning] profiling the model" in out.stdout
    assert "experiment 2" in out.stdout and "| global" in out.stdout


TRAIN = """import argparse, torch, deepspeed
p = argparse.ArgumentParser(); p.add_argument("--local_rank", type=int); p.add_argument("--mbs")
deepspeed.add_config_arguments(p); a = p.parse_args()
engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 1), config=a.deepspeed_config)
for _ in range(4):
    engine.backward(engine(torch.randn(engine.train_micro_batch_size_per_gpu(), 4)).sum())
    engine.step()
print(f"trained with micro-batch {engine.train_micro_batch_size_per_gpu()} (--mbs {a.mbs})")
"""


@pytest.mark.timeout(600)
def test_run_mode_trains_with_the_best_config(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    config = {"train_micro_batch_size_per_gpu": [2, 4], "zero_optimization": {"stage": 0},
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "autotuning": {"enabled": True, "start_profile_step": 1, "end_profile_step": 2,
                             "model_info": {"num_params": 5},
                             "arg_mappings": {"train_micro_batch_size_per_gpu ": "--mbs"}}}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    out = _deepspeed(["--autotuning", "run", "--num_gpus", "1", "train.py", "--mbs", "1",
                      "--deepspeed_config", "ds.json"], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    best = json.loads((tmp_path / "autotuning_results" / "summary.json").read_text())["best"]
    mbs = best["micro_batch"]
    assert f"--mbs {mbs}" in (tmp_path / "autotuning_results" / "cmd_optimal.txt").read_text()
    assert "[autotuning] run: training with" in out.stdout
    assert f"trained with micro-batch {mbs} (--mbs {mbs})" in out.stdout  # arg_mappings too


FAILING = "import sys\nprint('this script always fails', flush=True)\nsys.exit(3)\n"


def test_all_experiments_failing_name_their_logs(tmp_path):
    (tmp_path / "broken.py").write_text(FAILING)
    config = {"train_micro_batch_size_per_gpu": [1, 2], "zero_optimization": {"stage": 0},
              "autotuning": {"enabled": True, "model_info": {"num_params": 1000}}}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    out = _deepspeed(["--autotuning", "tune", "--num_gpus", "1", "broken.py", "--deepspeed",
                      "ds.json"], tmp_path)
    assert out.returncode == 1
    assert "every autotuning experiment failed" in out.stderr
    for name in ("z0_gas1_tmbspg1", "z0_gas1_tmbspg2"):
        log = tmp_path / "autotuning_results" / name / "stdout_stderr.log"
        assert f"{name}: " in out.stderr and str(log) in out.stderr
        assert "this script always fails" in log.read_text()


@pytest.mark.parametrize("config,needle", [
    ({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}},
     "autotuning has nothing to tune"),
    ({"autotuning": {"metric": "speed"}}, "autotuning.metric"),
])
def test_bad_autotuning_input_is_one_clear_line(tmp_path, config, needle):
    (tmp_path / "ds.json").write_text(json.dumps(config))
    out = _deepspeed(["--autotuning", "tune", "--num_gpus", "1", DEMO, "--deepspeed_config",
                      "ds.json"], tmp_path, timeout=120)
    assert out.returncode == 1 and needle in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_no_config_among_the_script_arguments(tmp_path):
    out = _deepspeed(["--autotuning", "tune", "--num_gpus", "1", DEMO, "--steps", "2"], tmp_path,
                     timeout=120)
    assert out.returncode == 1 and "needs the DeepSpeed config file" in out.stderr
