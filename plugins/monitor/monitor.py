"""``MonitorMaster``: fans ``(name, value, step)`` events out to every enabled backend.

Only global rank 0 writes: on other ranks no backend is even constructed, so a multi-rank job
produces one set of logs, and the other ranks never need the backend libraries' side effects
(W&B runs, event files). Each backend module is imported only when its section is enabled, so a
missing optional library only matters to the users who asked for that backend.
"""
import importlib
import os

from deepspeed.monitor.config import get_monitor_config

# section key -> (module, class) of its backend
BACKENDS = {
    "tensorboard": ("deepspeed.monitor.tensorboard", "TensorBoardMonitor"),
    "wandb": ("deepspeed.monitor.wandb", "WandbMonitor"),
    "csv_monitor": ("deepspeed.monitor.csv_monitor", "csvMonitor"),
    "comet": ("deepspeed.monitor.comet", "CometMonitor"),
}


def global_rank() -> int:
    """This process's global rank: from ``deepspeed.comm`` once initialised, else ``RANK``."""
    import deepspeed.comm as dist

    if dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def require(module_name: str, section: str, package: str):
    """Import an optional backend library, or say which pip package the section needs."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"'{section}.enabled' is true, but the '{module_name}' module is not "
                          f"installed: pip install {package}  (or pip install "
                          f"deepspeed[{section}])") from exc


class Monitor:
    """One backend. Subclasses write events in ``write_events`` and release files or runs in
    ``close``; they are only constructed on global rank 0."""

    def __init__(self, section_config):
        self.config = section_config
        self.enabled = bool(section_config.enabled)

    def write_events(self, event_list):
        raise NotImplementedError

    def close(self):
        """Flush and release what the backend holds open; safe to call twice."""


def check_events(event_list):
    """Reject anything but ``(name: str, value, step)`` triples before any backend sees them."""
    events = list(event_list)
    for event in events:
        if not (isinstance(event, (tuple, list)) and len(event) == 3 and isinstance(event[0], str)):
            raise ValueError(f"monitor events are (name: str, value, step) tuples, got {event!r}")
    return events


class MonitorMaster(Monitor):
    """The backends ``config`` enables (a ``DeepSpeedConfig``, a config dict or a
    ``DeepSpeedMonitorConfig``), as one monitor."""

    def __init__(self, config):
        self.config = get_monitor_config(config)
        self.enabled = self.config.enabled
        self.rank = global_rank()
        self.monitors = {}
        if self.rank != 0:
            return
        for key, (module_name, class_name) in BACKENDS.items():
            section = getattr(self.config, key)
            if section.enabled:
                backend = getattr(importlib.import_module(module_name), class_name)
                self.monitors[key] = backend(section)

    # upstream spellings of the single backends
    @property
    def tb_monitor(self):
        return self.monitors.get("tensorboard")

    @property
    def wandb_monitor(self):
        return self.monitors.get("wandb")

    @property
    def csv_monitor(self):
        return self.monitors.get("csv_monitor")

    @property
    def comet_monitor(self):
        return self.monitors.get("comet")

    def write_events(self, event_list):
        """Write ``[(name, value, step), ...]`` to every enabled backend (rank 0 only). Use
        ``engine.global_samples`` as the step: some backends reject mixed step series."""
        events = check_events(event_list)
        for monitor in self.monitors.values():
            monitor.write_events(events)

    def close(self):
        for monitor in self.monitors.values():
            monitor.close()
