"""The `comms_logger` config section.

Its model is the core's `CommsLoggerSettings` (``deepspeed.comm.state``): ``deepspeed.comm.configure``
must read the same keys without this plugin, so the one definition lives there and the plugin
registers it as its section under the name it always had.
"""
from deepspeed.comm.state import CommsLoggerSettings

CommsLoggerConfig = CommsLoggerSettings

__all__ = ["CommsLoggerConfig"]
