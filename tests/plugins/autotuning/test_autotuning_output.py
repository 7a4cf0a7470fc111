"""What the autotuner shows a person, with the experiments' jobs stubbed (no launcher run): a
bar counting experiments on a terminal, and the results as a PNG next to summary.txt."""
import io
import json
import sys

from png_checks import assert_png, bars, marked_points

from deepspeed.autotuning import Autotuner, jobs
from deepspeed.launcher import runner

THROUGHPUT = {1: 10.0, 2: 30.0, 4: 20.0}  # samples/s per micro-batch size: 2 is the best


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _stub_job(command, name, config, exp_dir, result_file, arg_values, overwrite, env=None):
    value = THROUGHPUT[config["train_micro_batch_size_per_gpu"]]
    return jobs.JobResult(name, {"throughput": value, "latency": 1e3 / value, "FLOPS": value},
                          0, f"{exp_dir}/stdout_stderr.log")


def test_experiments_are_counted_on_a_terminal_and_plotted(tmp_path, monkeypatch, capsys):
    config = {"train_micro_batch_size_per_gpu": sorted(THROUGHPUT),
              "zero_optimization": {"stage": 0},
              "autotuning": {"enabled": True, "model_info": {"num_params": 1000}}}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(jobs, "run_job", _stub_job)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    argv = ["--autotuning", "tune", "--num_gpus", "1", "train.py", "--deepspeed", "ds.json"]
    assert Autotuner(runner.parse_args(argv), argv).main() == 0

    assert "autotuning experiments: 3" in terminal.getvalue()
    out = capsys.readouterr().out
    assert out.count("[autotuning] [") == 3 and "| global" in out  # lines above the bar
    results = tmp_path / "autotuning_results"
    assert_png(results / "summary.png")
    summary = json.loads((results / "summary.json").read_text())
    assert summary["best"]["micro_batch"] == 2
    # the figure as write_summary drew it: one bar per experiment, the chosen one starred
    from deepspeed.autotuning.report import experiments_figure

    ax = experiments_figure("throughput", summary["experiments"], summary["best"]).axes[0]
    drawn = bars(ax)
    assert dict(drawn) == {f"z0_gas1_tmbspg{mbs}": value for mbs, value in THROUGHPUT.items()}
    assert marked_points(ax) == [(30.0, [label for label, _ in drawn].index("z0_gas1_tmbspg2"))]


def test_a_missing_script_stops_before_any_experiment(tmp_path, monkeypatch):
    import pytest

    (tmp_path / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": [1, 2]}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(jobs, "run_job", lambda *a, **k: pytest.fail("an experiment ran"))
    argv = ["--autotuning", "tune", "--num_gpus", "1", "trian.py", "--deepspeed", "ds.json"]
    with pytest.raises(runner.LauncherError, match="the user script 'trian.py' does not exist"):
        Autotuner(runner.parse_args(argv), argv)
