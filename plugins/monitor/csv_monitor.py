"""``csvMonitor``: one CSV file per event name, ``output_path/job_name/<name>.csv``.

The file name is the event name with ``/`` and spaces replaced by ``_``; the header is
``step,<last /-component of the name>``; each event appends one ``step,value`` row. Appending
(and writing the header only to a new file) lets a resumed job continue the same files.
"""
import csv
import os

from deepspeed.monitor.monitor import Monitor


def csv_file_name(event_name: str) -> str:
    return event_name.replace("/", "_").replace(" ", "_") + ".csv"


def log_dir(section_config) -> str:
    """``output_path/job_name``; an empty ``output_path`` means the launch directory."""
    return os.path.join(section_config.output_path or os.getcwd(), section_config.job_name)


class csvMonitor(Monitor):  # noqa: N801 (the documented name)
    def __init__(self, csv_config):
        super().__init__(csv_config)
        self.log_dir = log_dir(csv_config)
        os.makedirs(self.log_dir, exist_ok=True)

    def write_events(self, event_list):
        if not self.enabled:
            return
        for name, value, step in event_list:
            path = os.path.join(self.log_dir, csv_file_name(name))
            new_file = not os.path.exists(path)
            with open(path, "a", newline="") as handle:
                writer = csv.writer(handle)
                if new_file:
                    writer.writerow(["step", name.split("/")[-1]])
                writer.writerow([step, _plain(value)])


def _plain(value):
    """Tensors become numbers, so the file holds ``0.5`` rather than ``tensor(0.5)``."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value
