"""What deepspeed.comm remembers about the process groups: who created them, and their timeouts.

torch.distributed does not expose a group's timeout publicly, yet a timeout error is only
actionable when it states the limit that was hit, so the value given to `init_distributed` and
`new_group` is kept here. The settings of the communication logger (`CommsLoggerSettings`) are
defined here too, once, for `deepspeed.comm.configure` and the comms-logging plugin alike.
"""
import threading
from datetime import timedelta
from typing import Any, List, Mapping, Optional

from pydantic import Field, ValidationError, field_validator

from deepspeed.config.model import DeepSpeedConfigModel

_lock = threading.Lock()
_default_timeout: Optional[timedelta] = None
_origin = None  # who made the default group: "deepspeed.comm" or "caller" (adopted)
_group_timeouts = {}  # ProcessGroup -> timedelta (subgroups made through deepspeed.comm.new_group)


def set_default(timeout: Optional[timedelta], origin: str):
    global _default_timeout, _origin
    with _lock:
        _default_timeout, _origin = timeout, origin


def default_timeout() -> Optional[timedelta]:
    return _default_timeout


def origin() -> Optional[str]:
    """Who created the default group as far as deepspeed.comm knows; None before it saw one."""
    return _origin


def set_group_timeout(group, timeout: Optional[timedelta]):
    with _lock:
        _group_timeouts[group] = timeout


def timeout_of(group) -> Optional[timedelta]:
    if group is None:
        return _default_timeout
    with _lock:
        return _group_timeouts.get(group, _default_timeout)


def forget_group(group):
    with _lock:
        _group_timeouts.pop(group, None)


def reset():
    global _default_timeout, _origin
    with _lock:
        _default_timeout, _origin = None, None
        _group_timeouts.clear()


# --------------------------------------------------------------------------- comms_logger settings
_PROF_OPS_HINT = "must be a list of op names such as ['all_reduce', 'all_gather']"
# the test module of the key-effect table's rows (``tested_by``, see deepspeed.config.model)
UNIT = "tests/plugins/comms_logging/test_comms_logger_unit.py::"


class CommsLoggerSettings(DeepSpeedConfigModel):
    """The ``comms_logger`` settings, defined once: ``deepspeed.comm.configure()`` keeps the live
    process-wide settings in one (no plugin needed), and the comms-logging plugin validates an
    engine config's ``comms_logger`` section with this same model. Defaults are the documented
    ones: off, quiet, every op profiled, no caller names."""

    # what each key does here (see deepspeed.config.model)
    tested_by = {
        "enabled": UNIT + "test_disabled_logger_records_nothing_and_one_record_counts_once",
        "verbose": UNIT + "test_verbose_prints_the_documented_line",
        "prof_all": UNIT + "test_prof_ops_selects_ops_and_prof_true_forces_one",
        "prof_ops": UNIT + "test_prof_ops_selects_ops_and_prof_true_forces_one",
        "debug": UNIT + "test_debug_appends_the_caller",
    }

    enabled: bool = False
    verbose: bool = False  # print one line per logged op as it completes
    prof_all: bool = True  # log every op; when false only `prof_ops` (and calls with prof=True)
    prof_ops: List[str] = Field(default_factory=list)  # op names, e.g. ["all_reduce"]
    debug: bool = False  # append "| [Caller Func: <fn>]" to each op's name

    @field_validator("enabled", "verbose", "prof_all", "debug", mode="before")
    @classmethod
    def _true_or_false(cls, value: Any) -> Any:
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value

    @field_validator("prof_ops", mode="before")
    @classmethod
    def _op_names(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str) or not isinstance(value, (list, tuple)) \
                or not all(isinstance(v, str) for v in value):
            raise ValueError(_PROF_OPS_HINT)
        return list(value)

    def update(self, values: Mapping[str, Any], where: str = "") -> None:
        """Set ``values`` in place, each validated, so that a logger holding these settings sees
        the change at once. Unknown keys and bad values raise ValueError naming ``where`` + key."""
        allowed = list(type(self).model_fields)
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in comms_logger; allowed: {allowed}")
        for key, value in values.items():
            try:
                setattr(self, key, value)
            except ValidationError as exc:
                message = exc.errors()[0]["msg"].removeprefix("Value error, ")
                raise ValueError(f"{where}{key} {message}, got {value!r}") from None
