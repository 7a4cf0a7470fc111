"""The ``comms_logging`` plugin: owns the ``comms_logger`` section and feeds a `CommsLogger`.

Enabled by ``"comms_logger": {"enabled": true}``. Implementing ``deepspeed_comm_op`` is what makes
the engine subscribe to deepspeed.comm (ops are not timed otherwise). The engine's subscription
is also where ``deepspeed.comm.log_summary()`` looks for a summary: the plugin answers it
through the ``deepspeed_comm_summary`` hook; both go away with ``engine.destroy()``.
"""
from deepspeed.comms_logging.config import CommsLoggerConfig
from deepspeed.comms_logging.logger import CommsLogger
from deepspeed.hooks import hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin
from deepspeed.utils.lazy_module import lazy_module

dist = lazy_module("deepspeed.comm")  # loaded on first use (the launcher imports this plugin without torch)

SECTION = "comms_logger"


class CommsLoggerPlugin(DeepSpeedPlugin):
    config_sections = {SECTION: CommsLoggerConfig}

    def __init__(self):
        self.logger = None

    @hookimpl
    def deepspeed_comms_logger(self, settings):
        """The logger `deepspeed.comm.configure(enabled=True)` registers when no engine exists;
        it reads `settings` (core's live comms_logger settings) on every op."""
        return CommsLogger(settings)

    @hookimpl
    def deepspeed_engine_init(self, engine, config):
        existing = dist.configured_comms_logger()
        if existing is not None:
            # init_distributed(config=...) already logs every op of this process: share it, so
            # one summary covers everything and no op is counted twice.
            self.logger = existing
            return
        self.logger = CommsLogger(config.section(SECTION))
        self.answers_summary = True

    @hookimpl
    def deepspeed_comm_summary(self, engine, show_straggler, return_dict):
        if not getattr(self, "answers_summary", False):
            return None  # the configure()-made logger answers log_summary() itself
        return self.logger.log_summary(show_straggler=show_straggler, return_dict=return_dict)

    @hookimpl
    def deepspeed_comm_op(self, record):
        if self.logger is not None:
            self.logger.append(record)
