"""The `comms_logger` config section."""
from typing import List

from pydantic import Field

from deepspeed.config import DeepSpeedConfigModel


class CommsLoggerConfig(DeepSpeedConfigModel):
    """Which deepspeed.comm ops the communication logger records and how it reports them.

    Defaults are the documented ones: off, quiet, every op profiled, no caller names.
    """

    enabled: bool = False
    verbose: bool = False  # print one line per logged op as it completes
    prof_all: bool = True  # log every op; when false only `prof_ops` (and calls with prof=True)
    prof_ops: List[str] = Field(default_factory=list)  # op names, e.g. ["all_reduce"]
    debug: bool = False  # append "| [Caller Func: <fn>]" to each op's name
