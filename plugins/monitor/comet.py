"""``CometMonitor``: scalars into a Comet experiment (``online: false`` keeps it on disk).

``samples_log_interval`` throttles each series: a point is logged when its step is at least that
many samples past the series' last logged point, so frequent steps do not flood the experiment.
"""
from deepspeed.monitor.csv_monitor import _plain
from deepspeed.monitor.monitor import Monitor, require


class CometMonitor(Monitor):
    def __init__(self, comet_config):
        super().__init__(comet_config)
        comet_ml = require("comet_ml", "comet", "comet_ml")
        self.samples_log_interval = comet_config.samples_log_interval
        self._last_logged = {}
        experiment_config = comet_ml.ExperimentConfig(name=comet_config.experiment_name)
        self.experiment = comet_ml.start(api_key=comet_config.api_key,
                                         project=comet_config.project,
                                         workspace=comet_config.workspace,
                                         experiment_key=comet_config.experiment_key,
                                         mode=comet_config.mode, online=comet_config.online,
                                         experiment_config=experiment_config)

    def write_events(self, event_list):
        if not self.enabled or self.experiment is None:
            return
        for name, value, step in event_list:
            last = self._last_logged.get(name)
            if last is not None and step - last < self.samples_log_interval:
                continue
            self._last_logged[name] = step
            self.experiment.log_metric(name, _plain(value), step=step)

    def close(self):
        if self.experiment is not None:
            self.experiment.end()
            self.experiment = None
