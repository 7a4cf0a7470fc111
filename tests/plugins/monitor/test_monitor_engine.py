"""The monitor plugin in a 2-rank training run: the automatic events, written by rank 0 only."""
import csv
import functools
import os

import pytest

from monitor_training import MICRO, GAS, config, train

STEPS = 3
WORLD = 2


def _read_csv(path):
    with open(path, newline="") as handle:
        return list(csv.reader(handle))


def _train_with_csv(out_dir, steps):
    from deepspeed import comm as dist

    own_dir = os.path.join(out_dir, f"rank{dist.get_rank()}")  # tells the ranks' files apart
    _, expected = train(config(csv_monitor={"enabled": True, "output_path": own_dir,
                                            "job_name": "job"}), steps)
    return expected


def test_csv_monitor_logs_loss_and_lr_at_each_step_from_rank_0(dist_pool, tmp_path):
    expected = dist_pool.run(_train_with_csv, args=(str(tmp_path), STEPS))[0]
    job = tmp_path / "rank0" / "job"
    assert sorted(os.listdir(job)) == ["Train_Samples_lr.csv", "Train_Samples_train_loss.csv"]
    assert not (tmp_path / "rank1").exists()

    loss_rows = _read_csv(job / "Train_Samples_train_loss.csv")
    lr_rows = _read_csv(job / "Train_Samples_lr.csv")
    assert loss_rows[0] == ["step", "train_loss"] and lr_rows[0] == ["step", "lr"]
    steps = [int(row[0]) for row in loss_rows[1:]]
    assert steps == [MICRO * GAS * WORLD * (i + 1) for i in range(STEPS)]
    assert steps == [samples for samples, _, _ in expected]
    assert [float(r[1]) for r in loss_rows[1:]] == pytest.approx([e[1] for e in expected])
    assert [int(r[0]) for r in lr_rows[1:]] == steps
    assert [float(r[1]) for r in lr_rows[1:]] == pytest.approx([e[2] for e in expected])
    assert len({float(r[1]) for r in lr_rows[1:]}) == STEPS  # warm-up: the lr changes each step


def _train_with_tensorboard(out_dir, steps):
    _, expected = train(config(tensorboard={"enabled": True, "output_path": out_dir,
                                            "job_name": "tb"}), steps)
    return expected


def test_tensorboard_event_file_holds_the_train_loss(dist_pool, tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoard support needs the tensorboard package")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    expected = dist_pool.run(_train_with_tensorboard, args=(str(tmp_path), STEPS))[0]
    log_dir = tmp_path / "tb"
    event_files = [name for name in os.listdir(log_dir) if "tfevents" in name]
    assert len(event_files) == 1  # rank 1 wrote none into the shared directory
    events = EventAccumulator(str(log_dir))
    events.Reload()
    loss = events.Scalars("Train/Samples/train_loss")
    assert [e.step for e in loss] == [samples for samples, _, _ in expected]
    assert [e.value for e in loss] == pytest.approx([e[1] for e in expected], rel=1e-6)
    lr = events.Scalars("Train/Samples/lr")
    assert [e.value for e in lr] == pytest.approx([e[2] for e in expected], rel=1e-6)
    assert "Train/Samples/loss_scale" not in events.Tags()["scalars"]


def _count_after_step_calls(ds_config, steps):
    """How often the monitor plugin's after_step hook runs, counted by wrapping it (the wrapper
    keeps the hookimpl marker, so pluggy registers it in place of the original)."""
    from deepspeed.monitor.plugin import MonitorPlugin

    original = MonitorPlugin.deepspeed_after_step
    calls = []

    @functools.wraps(original)
    def counting(self, engine):
        calls.append(engine.global_steps)
        return original(self, engine)

    MonitorPlugin.deepspeed_after_step = counting
    try:
        engine, _ = train(ds_config, steps)
        names = [impl.plugin_name for impl in engine.hook.deepspeed_after_step.get_hookimpls()]
    finally:
        MonitorPlugin.deepspeed_after_step = original
    return len(calls), "monitor" in names


@pytest.mark.parametrize("sections, enabled", [
    ({}, False),
    ({"csv_monitor": {"enabled": False}, "tensorboard": {"job_name": "x"}}, False),
    ({"csv_monitor": {"enabled": True}}, True),
])
def test_plugin_hooks_run_only_when_a_backend_is_enabled(dist_pool, tmp_path, sections, enabled):
    if "csv_monitor" in sections:
        sections["csv_monitor"]["output_path"] = str(tmp_path)
    results = dist_pool.run(_count_after_step_calls, args=(config(**sections), 2))
    for calls, registered in results:
        assert registered is enabled
        assert calls == (2 if enabled else 0)


def _train_fp16(out_dir):
    from deepspeed import comm as dist

    engine, expected = train(config(fp16={"enabled": True, "initial_scale_power": 4},
                                    csv_monitor={"enabled": True, "output_path": out_dir,
                                                 "job_name": "fp16"}), 2)
    return expected, float(engine.optimizer.cur_scale), dist.get_rank()


def test_fp16_adds_the_loss_scale(dist_pool, tmp_path):
    expected, scale, _ = dist_pool.run(_train_fp16, args=(str(tmp_path),))[0]
    rows = _read_csv(tmp_path / "fp16" / "Train_Samples_loss_scale.csv")
    assert rows[0] == ["step", "loss_scale"]
    assert [int(r[0]) for r in rows[1:]] == [samples for samples, _, _ in expected]
    assert float(rows[-1][1]) == scale


def _train_timed(out_dir, steps):
    cfg = config(csv_monitor={"enabled": True, "output_path": out_dir, "job_name": "timed"})
    cfg["wall_clock_breakdown"] = True
    train(cfg, steps)


def test_wall_clock_breakdown_writes_the_five_timing_series(dist_pool, tmp_path):
    dist_pool.run(_train_timed, args=(str(tmp_path), STEPS))
    job = tmp_path / "timed"
    for phase in ("forward", "backward", "backward_inner", "backward_allreduce", "step"):
        rows = _read_csv(job / f"Train_Samples_elapsed_time_ms_{phase}.csv")
        assert rows[0] == ["step", f"elapsed_time_ms_{phase}"]
        assert [int(r[0]) for r in rows[1:]] == [MICRO * GAS * WORLD * (i + 1) for i in range(STEPS)]
        assert all(float(r[1]) >= 0.0 for r in rows[1:])
