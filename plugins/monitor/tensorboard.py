"""``TensorBoardMonitor``: scalars into TensorBoard event files under ``output_path/job_name``,
through ``torch.utils.tensorboard`` (which needs the ``tensorboard`` package) or, failing that,
``tensorboardX``."""
import os

from deepspeed.monitor.csv_monitor import _plain
from deepspeed.monitor.monitor import Monitor, require


def _summary_writer_class():
    try:
        from torch.utils.tensorboard import SummaryWriter
        return SummaryWriter
    except ImportError:
        return require("tensorboardX", "tensorboard", "tensorboard").SummaryWriter


class TensorBoardMonitor(Monitor):
    def __init__(self, tensorboard_config):
        super().__init__(tensorboard_config)
        base = tensorboard_config.output_path or os.getcwd()
        self.log_dir = os.path.join(base, tensorboard_config.job_name)
        os.makedirs(self.log_dir, exist_ok=True)
        self.summary_writer = _summary_writer_class()(log_dir=self.log_dir)

    def write_events(self, event_list, flush=True):
        if not self.enabled or self.summary_writer is None:
            return
        for name, value, step in event_list:
            self.summary_writer.add_scalar(name, _plain(value), step)
        if flush:
            self.summary_writer.flush()

    def close(self):
        if self.summary_writer is not None:
            self.summary_writer.close()
            self.summary_writer = None
