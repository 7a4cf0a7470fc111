"""``WandbMonitor``: scalars into a Weights & Biases run (``team`` is the entity). Honours the
usual W&B environment, e.g. ``WANDB_MODE=offline`` to keep the run on disk."""
from deepspeed.monitor.csv_monitor import _plain
from deepspeed.monitor.monitor import Monitor, require


class WandbMonitor(Monitor):
    def __init__(self, wandb_config):
        super().__init__(wandb_config)
        self._wandb = require("wandb", "wandb", "wandb")
        self.run = self._wandb.init(project=wandb_config.project, group=wandb_config.group,
                                    entity=wandb_config.team)

    def log(self, data, step=None, commit=None, sync=None):
        """Log a dict of values in one W&B step (upstream's signature; ``sync`` is ignored)."""
        if self.enabled and self.run is not None:
            self.run.log(data, step=step, commit=commit)

    def write_events(self, event_list):
        if not self.enabled or self.run is None:
            return
        for name, value, step in event_list:
            self.run.log({name: _plain(value)}, step=step)

    def close(self):
        if self.run is not None:
            self.run.finish()
            self.run = None
