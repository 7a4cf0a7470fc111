"""``deepspeed.comms_logging``: the communication logger behind ``deepspeed.comm.log_summary``.

Enable it with ``"comms_logger": {"enabled": true}`` in the DeepSpeed config (or
``deepspeed.comm.configure(enabled=True)``), then call ``deepspeed.comm.log_summary()``.
"""
from deepspeed.comms_logging.config import CommsLoggerConfig
from deepspeed.comms_logging.logger import CommsLogger, verbose_line
from deepspeed.comms_logging.summary import format_size, render_table

__all__ = ["CommsLogger", "CommsLoggerConfig", "format_size", "render_table", "verbose_line"]
