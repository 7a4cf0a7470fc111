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


def _deepspeed(args, cwd, timeout=280):
    return subprocess.run([sys.executable, "-m", "deepspeed.launcher.runner"] + args, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_tune_and_run_on_the_demo_gpt(tmp_path):
    config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": [0, 1]},
              "optimizer": {"type": "AdamW", "params": {"lr": 5e-3}},
              "autotuning": {"enabled": True, "start_profile_step": 1, "end_profile_step": 2,
                             "tuner_type": "gridsearch",
                             "arg_mappings": {"train_micro_batch_size_per_gpu ": "--print_every"}}}
    (tmp_path / "ds_config.json").write_text(json.dumps(config))
    out = _deepspeed(["--autotuning", "run", "--num_gpus", "2", DEMO, "--steps", "3",
                      "--deepspeed_config", "ds_config.json"], tmp_path)
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
    assert sorted(os.listdir(tmp_path / "autotuning_exps")) == \
        ["profile_model_info.json", "z0_gas1_tmbspg4.json", "z1_gas1_tmbspg4.json"]
    info = json.loads((results / "profile_model_info" / "model_info.json").read_text())
    assert info["num_params"] == 104192 and info["activation_mem_per_sample"] > 0
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    assert optimal["zero_optimization"]["stage"] == int(best[1])
    assert optimal["train_micro_batch_size_per_gpu"] == 4 and optimal["train_batch_size"] == 8
    assert optimal["autotuning"] == config["autotuning"]  # experiment keys gone again
    cmd = (results / "cmd_optimal.txt").read_text()
    assert "ds_config_optimal.json" in cmd and "--print_every 4" in cmd  # arg_mappings
    assert "--autotuning" not in cmd
    text = (results / "summary.txt").read_text()
    assert text.splitlines()[0].startswith("| tuning_space") and "| global" in text
    # progress while running, then the table, then the run with the best config
    assert "[autotuning] profiling the model" in out.stdout
    assert "experiment 2" in out.stdout and "| global" in out.stdout
    assert "[autotuning] run: training with" in out.stdout
    assert "demo summary" in out.stdout and "optimizer steps   : 3 x 8 samples" in out.stdout


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
