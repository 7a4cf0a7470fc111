"""Every key of the ``comet`` and ``wandb`` sections reaches the library call that opens the
run (stand-ins for ``comet_ml`` and ``wandb`` record the call: no account, no network)."""
import types

from deepspeed.monitor.monitor import MonitorMaster


def _stand_in(monkeypatch, name, **functions):
    module = types.ModuleType(name)
    for attr, function in functions.items():
        setattr(module, attr, function)
    monkeypatch.setitem(__import__("sys").modules, name, module)
    return module


def test_every_comet_key_reaches_comet_ml_start(monkeypatch):
    calls = []

    class ExperimentConfig:
        def __init__(self, name=None):
            self.name = name

    def start(**kwargs):
        calls.append(dict(kwargs, experiment_name=kwargs.pop("experiment_config").name))
        return types.SimpleNamespace(log_metric=lambda *a, **k: None, end=lambda: None)

    _stand_in(monkeypatch, "comet_ml", ExperimentConfig=ExperimentConfig, start=start)
    key = "a" * 32
    monitor = MonitorMaster({"comet": {"enabled": True, "project": "p", "workspace": "w",
                                       "api_key": "k", "experiment_name": "n",
                                       "experiment_key": key, "online": False,
                                       "mode": "create"}})
    monitor.close()
    assert calls == [{"api_key": "k", "project": "p", "workspace": "w", "experiment_key": key,
                      "mode": "create", "online": False, "experiment_name": "n"}]


def test_comet_samples_log_interval_throttles_each_series(monkeypatch):
    logged = []

    class ExperimentConfig:
        def __init__(self, name=None):
            self.name = name

    def start(**kwargs):
        return types.SimpleNamespace(
            log_metric=lambda name, value, step=None: logged.append((name, value, step)),
            end=lambda: None)

    _stand_in(monkeypatch, "comet_ml", ExperimentConfig=ExperimentConfig, start=start)
    monitor = MonitorMaster({"comet": {"enabled": True, "samples_log_interval": 10}})
    monitor.write_events([("loss", 1.0, 4), ("loss", 0.9, 8), ("loss", 0.8, 16)])
    monitor.close()
    assert logged == [("loss", 1.0, 4), ("loss", 0.8, 16)]


def test_every_wandb_key_reaches_wandb_init(monkeypatch):
    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        return types.SimpleNamespace(log=lambda *a, **k: None, finish=lambda: None)

    _stand_in(monkeypatch, "wandb", init=init)
    monitor = MonitorMaster({"wandb": {"enabled": True, "project": "p", "group": "g",
                                       "team": "t"}})
    monitor.close()
    assert calls == [{"project": "p", "group": "g", "entity": "t"}]
