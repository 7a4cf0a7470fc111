"""What deepspeed.comm remembers about the process groups: who created them, and their timeouts.

torch.distributed does not expose a group's timeout publicly, yet a timeout error is only
actionable when it states the limit that was hit, so the value given to `init_distributed` and
`new_group` is kept here.
"""
import threading
from datetime import timedelta
from typing import Optional

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
