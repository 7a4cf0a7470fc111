"""``deepspeed.comms_logging``: the communication logger behind ``deepspeed.comm.log_summary``.

Enable it with ``"comms_logger": {"enabled": true}`` in the DeepSpeed config (or
``deepspeed.comm.configure(enabled=True)``), then call ``deepspeed.comm.log_summary()``;
``plot_summary(deepspeed.comm.log_summary(return_dict=True), "comms.png")`` draws it (bytes and
latency per op; needs the ``plots`` extra).
"""

from deepspeed.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "CommsLogger": "deepspeed.comms_logging.logger",
    "CommsLoggerConfig": "deepspeed.comms_logging.config",
    "format_size": "deepspeed.comms_logging.summary",
    "plot_summary": "deepspeed.comms_logging.summary",
    "render_table": "deepspeed.comms_logging.summary",
    "verbose_line": "deepspeed.comms_logging.logger",
}

__all__ = ["CommsLogger", "CommsLoggerConfig", "format_size", "plot_summary", "render_table",
           "verbose_line"]

# loaded on first use: the plugin catalog imports this package with every run (see lazy_exports)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
