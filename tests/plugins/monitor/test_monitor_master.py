"""``MonitorMaster`` and the backends on their own: config defaults, user events, rank gating,
missing libraries."""
import csv
import os
import sys

import pytest

from deepspeed.config import DeepSpeedConfig
from deepspeed.monitor.config import (CometConfig, CSVConfig, DeepSpeedMonitorConfig,
                                      TensorBoardConfig, WandbConfig, get_monitor_config)
from deepspeed.monitor.monitor import MonitorMaster


def test_documented_defaults():
    for section in (TensorBoardConfig(), CSVConfig()):
        assert (section.enabled, section.output_path, section.job_name) == \
            (False, "", "DeepSpeedJobName")
    wandb = WandbConfig()
    assert (wandb.enabled, wandb.group, wandb.team, wandb.project) == \
        (False, None, None, "deepspeed")
    comet = CometConfig()
    assert (comet.enabled, comet.samples_log_interval, comet.project, comet.experiment_name) == \
        (False, 100, None, None)
    assert DeepSpeedMonitorConfig().enabled is False
    assert get_monitor_config({"wandb": {"enabled": True}}).enabled is True


def test_bad_values_name_the_key():
    with pytest.raises(Exception, match="experiment_key"):
        CometConfig(experiment_key="short")
    with pytest.raises(Exception, match="mode"):
        CometConfig(mode="sometimes")
    with pytest.raises(Exception, match="output_pth"):
        get_monitor_config({"csv_monitor": {"enabled": True, "output_pth": "/tmp"}})
    with pytest.raises(TypeError, match="MonitorMaster needs"):
        MonitorMaster(42)


def _rows(path):
    with open(path, newline="") as handle:
        return list(csv.reader(handle))


def test_user_events_go_to_one_csv_file_per_name(tmp_path):
    monitor = MonitorMaster({"csv_monitor": {"enabled": True, "output_path": str(tmp_path),
                                             "job_name": "custom"}})
    monitor.write_events([("Time per step", 0.25, 8), ("Train/Eval/acc", 0.5, 8)])
    monitor.write_events([("Time per step", 0.125, 16)])
    job = tmp_path / "custom"
    assert _rows(job / "Time_per_step.csv") == [["step", "Time per step"], ["8", "0.25"],
                                                ["16", "0.125"]]
    assert _rows(job / "Train_Eval_acc.csv") == [["step", "acc"], ["8", "0.5"]]
    with pytest.raises(ValueError, match="tuples"):
        monitor.write_events([("only a name", 1.0)])


def test_a_deepspeed_config_is_accepted(tmp_path):
    from deepspeed.monitor.plugin import MonitorPlugin

    ds_config = DeepSpeedConfig({"train_batch_size": 2,
                                 "csv_monitor": {"enabled": True, "output_path": str(tmp_path)}},
                                sections=MonitorPlugin.config_sections, world_size=1)
    monitor = MonitorMaster(ds_config)
    assert list(monitor.monitors) == ["csv_monitor"] and monitor.csv_monitor is not None
    monitor.write_events([("loss", 1.5, 2)])
    assert _rows(tmp_path / "DeepSpeedJobName" / "loss.csv") == [["step", "loss"], ["2", "1.5"]]


def test_other_ranks_build_no_backend_and_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr("deepspeed.monitor.monitor.global_rank", lambda: 1)
    monitor = MonitorMaster({"csv_monitor": {"enabled": True, "output_path": str(tmp_path)}})
    assert monitor.enabled and monitor.monitors == {}
    monitor.write_events([("loss", 1.0, 1)])
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("section, module, package", [
    ("wandb", "wandb", "wandb"), ("comet", "comet_ml", "comet_ml")])
def test_a_missing_library_names_its_pip_package(monkeypatch, section, module, package):
    monkeypatch.setitem(sys.modules, module, None)  # makes ``import module`` fail
    with pytest.raises(ImportError, match=f"pip install {package}"):
        MonitorMaster({section: {"enabled": True}})


def test_tensorboard_backend_writes_readable_scalars(tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoard support needs the tensorboard package")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monitor = MonitorMaster({"tensorboard": {"enabled": True, "output_path": str(tmp_path),
                                             "job_name": "tb"}})
    monitor.write_events([("Time per step", 0.5, 4), ("Time per step", 0.25, 8)])
    monitor.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("Time per step")] == [(4, 0.5), (8, 0.25)]


def test_wandb_offline_run_is_created(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="W&B support needs the wandb package")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monitor = MonitorMaster({"wandb": {"enabled": True, "project": "monitor-test",
                                       "group": "g"}})
    try:
        run = monitor.wandb_monitor.run
        assert (run.project, run.group) == ("monitor-test", "g")
        monitor.write_events([("Train/Samples/train_loss", 0.5, 4)])
    finally:
        monitor.close()
    runs = [name for name in os.listdir(tmp_path / "wandb") if name.startswith("offline-run-")]
    assert len(runs) == 1


def test_comet_offline_experiment_logs_with_the_sample_interval(tmp_path, monkeypatch):
    pytest.importorskip("comet_ml", reason="Comet support needs the comet_ml package")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path))
    monitor = MonitorMaster({"comet": {"enabled": True, "online": False, "project": "t",
                                       "samples_log_interval": 10}})
    logged = []
    monkeypatch.setattr(monitor.comet_monitor.experiment, "log_metric",
                        lambda name, value, step=None: logged.append((name, value, step)))
    monitor.write_events([("loss", 1.0, 4), ("loss", 0.9, 8), ("loss", 0.8, 16)])
    monitor.close()
    assert logged == [("loss", 1.0, 4), ("loss", 0.8, 16)]


def test_the_tutorial_usage_through_deepspeed_config(tmp_path):
    """`MonitorMaster(DeepSpeedConfig("ds_config.json").monitor_config)` as the tutorial writes."""
    import json

    from deepspeed.monitor.monitor import MonitorMaster
    from deepspeed.runtime.config import DeepSpeedConfig

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_batch_size": 2, "csv_monitor": {
        "enabled": True, "output_path": str(tmp_path / "csv"), "job_name": "tutorial"}}))
    monitor = MonitorMaster(DeepSpeedConfig(str(path), world_size=1).monitor_config)
    monitor.write_events([("Test/accuracy", 0.5, 10), ("Test/accuracy", 0.75, 20)])
    monitor.close()
    rows = (tmp_path / "csv" / "tutorial" / "Test_accuracy.csv").read_text().splitlines()
    assert rows == ["step,accuracy", "10,0.5", "20,0.75"]


def test_monitor_config_is_an_object_of_sections(tmp_path):
    """Upstream's ``ds_config.monitor_config.csv_monitor`` / ``.tensorboard`` / ``.wandb``:
    the validated sections (defaults when omitted), each enough to build its backend."""
    from deepspeed.monitor.csv_monitor import csvMonitor

    ds_config = DeepSpeedConfig({"train_batch_size": 1, "csv_monitor": {
        "enabled": True, "output_path": str(tmp_path), "job_name": "run"}}, world_size=1)
    settings = ds_config.monitor_config
    assert isinstance(settings.csv_monitor, CSVConfig) and settings.csv_monitor.job_name == "run"
    assert settings.tensorboard == TensorBoardConfig() and settings.wandb == WandbConfig()
    assert settings.enabled and not DeepSpeedConfig({"train_batch_size": 1},
                                                    world_size=1).monitor_config.enabled
    backend = csvMonitor(settings.csv_monitor)
    backend.write_events([("Train/loss", 2.0, 1)])
    assert (tmp_path / "run" / "Train_loss.csv").read_text().splitlines() == ["step,loss", "1,2.0"]
    assert get_monitor_config(settings).csv_monitor == settings.csv_monitor
