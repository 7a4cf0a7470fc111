"""End to end through the real console scripts, as a user runs them."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deepspeed.testing.distributed import find_free_port

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
BIN = Path(sys.executable).parent


def free_port():
    return find_free_port()


def script(name):
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert found, f"console script {name} is not installed"
    return found


def run(cmd, env=None, timeout=240):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=ROOT)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def read_reports(folder, n):
    reports = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(n)]
    assert sorted(r["rank"] for r in reports) == list(range(n))
    return reports


def test_readme_demo_trains_on_two_processes():
    """20 steps: the demo exits non-zero unless its loss fell, which it does within 8."""
    out = run([script("deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()),
               "examples/train_demo.py", "--steps", "20"])
    assert "world size        : 2 (backend gloo)" in out
    assert "replicas identical: True" in out


def test_pipeline_example_trains_two_stages_on_two_processes():
    out = run([script("deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()),
               "examples/pipeline/train.py", "--steps", "30"])
    assert "pipeline of 2 stages x 1 data-parallel" in out
    assert "steps: 30 loss: " in out and "samples/sec: " in out  # the engine's progress line
    # the script exits non-zero unless the loss fell; check the summary line is there too
    assert "train loss 2." in out and "eval loss" in out


def test_moe_example_trains_expert_parallel_on_two_processes():
    """30 steps: the script exits non-zero unless the LM loss fell (3.49 -> 3.23 here)."""
    out = run([script("deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()),
               "examples/moe/train.py", "--steps", "30", "--ep-world-size", "2",
               "--num-experts", "4"])
    assert "ep_size 2 on 2 ranks: [2, 2] local experts" in out
    assert "('ep_size_2', 16, True)" in out  # the expert param groups reached the optimizer
    assert "dense replicas identical: True" in out
    # the script exits non-zero unless the LM loss fell; check the summary line is there too
    assert "train lm loss        : 3." in out and "eval lm loss" in out


def _assert_a_gloo_world_of_two(reports):
    for report in reports:
        assert report["world_size"] == 2 and report["backend"] == "gloo"
        assert report["sum_of_ranks"] == 1.0


def test_torchrun_gives_a_gloo_world_of_two(tmp_path):
    """The `deepspeed` launcher's gloo world of two is checked by the third-party packages test
    below (the same probe through `deepspeed --num_gpus 2`)."""
    run([script("torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port()),
         str(HERE / "probe_world.py"), str(tmp_path)])
    _assert_a_gloo_world_of_two(read_reports(tmp_path, 2))


def test_third_party_accelerator_and_plugin_in_one_launched_job(install_fixture_package, tmp_path):
    """One launch for two third-party packages: the accelerator named by DS_ACCELERATOR forms
    the gloo world (probe_world.py), then the plugin's hooks run in a short training in the same
    ranks (train_with_recorder.py)."""
    install_fixture_package("ds_example_accelerator")
    install_fixture_package("ds_example_plugin")
    run([script("deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()),
         str(HERE / "probe_then_train.py"), str(tmp_path)], env={"DS_ACCELERATOR": "example"})
    reports = read_reports(tmp_path, 2)
    _assert_a_gloo_world_of_two(reports)
    for report in reports:
        assert report["accelerator"] == "example"
        assert report["accelerator_module"] == "ds_example_accelerator"
    micro = ["before_forward", "after_forward", "before_backward"]
    boundary = micro + ["reduce_gradients", "after_backward", "before_step", "after_step"]
    expected = ["engine_init", "wrap_optimizer"] + (micro + ["after_backward"] + boundary) * 2
    for rank in range(2):
        lines = (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()
        calls = [json.loads(line) for line in lines]
        assert [c["hook"] for c in calls] == expected
        assert [c["global_steps"] for c in calls if c["hook"] == "after_step"] == [1, 2]


def test_ds_report_lists_accelerator_torch_and_plugins(install_fixture_package):
    install_fixture_package("ds_example_plugin")
    import torch

    out = run([script("ds_report")])
    assert "accelerator" in out and "cpu (backend gloo)" in out
    assert torch.__version__ in out
    import deepspeed

    assert f"{deepspeed.__version__}, " in out and "unknown, unknown" not in out
    assert "call_recorder [ds-example-plugin 0.1.0]" in out
    assert "enabled by: call_recorder" in out
    assert "needy_example" in out
    out = run([sys.executable, "-m", "deepspeed.env_report", "--hide_operator_status"])
    assert "op report" not in out and "torch version" in out
