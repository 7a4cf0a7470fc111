"""Turning torch.distributed's failures into errors a user can act on.

A collective that times out in gloo says only "Timed out waiting 3000ms for recv operation";
it does not say which op, on which rank, in which group, or that the usual cause is another rank
never entering the same collective. `CommTimeoutError` says all of that and keeps the original
error as its `__cause__`.
"""
import re
from datetime import timedelta
from typing import Optional

# Messages torch / gloo / NCCL use for a collective or store that gave up waiting.
_TIMEOUT = re.compile(r"timed out|timeout|time out|failed to pass monitoredBarrier", re.IGNORECASE)
# Messages a backend uses for a collective (or a variant of one) it does not implement.
_UNSUPPORTED = re.compile(
    r"does not support|not supported|unsupported|not implemented|"
    r"only (?:implemented|supported) for|cannot use", re.IGNORECASE)

# gloo's message for any op on a group whose connections an earlier timeout closed
_AFTER_EARLIER_TIMEOUT = re.compile(r"timeout caused pair closure", re.IGNORECASE)


class CommTimeoutError(RuntimeError):
    """A collective or point-to-point op gave up waiting for the other ranks."""

    def __init__(self, message, *, rank, op, group_size, timeout: Optional[timedelta]):
        super().__init__(message)
        self.rank = rank
        self.op = op
        self.group_size = group_size
        self.timeout = timeout


def is_timeout_error(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and not isinstance(exc, CommTimeoutError) \
        and bool(_TIMEOUT.search(str(exc)))


def is_unsupported_error(exc: BaseException) -> bool:
    if isinstance(exc, NotImplementedError):
        return True
    return isinstance(exc, (RuntimeError, ValueError)) and bool(_UNSUPPORTED.search(str(exc))) \
        and not is_timeout_error(exc)


def mentions_port_in_use(text: str) -> bool:
    """Whether an error text says the rendezvous port is taken (torch words it either way)."""
    text = text.lower()
    return "address already in use" in text or "eaddrinuse" in text


def port_in_use_error(exc: BaseException, addr: str, port: str) -> RuntimeError:
    """torch's EADDRINUSE names neither the port nor the way out: this does both."""
    return RuntimeError(
        f"cannot start the rendezvous on MASTER_ADDR={addr} MASTER_PORT={port}: address already "
        f"in use (another job, or a previous run still exiting, holds the port). Choose a free "
        f"port with the launcher's --master_port (deepspeed --master_port 29600 ...) or the "
        f"MASTER_PORT environment variable. torch said: {str(exc).strip().splitlines()[0]}")


def describe_timeout(timeout: Optional[timedelta]) -> str:
    if timeout is None:
        return "the timeout chosen by whoever created the group (not deepspeed.comm)"
    return f"{timeout.total_seconds():g} s"


def timeout_error(exc, *, rank, op, group_size, timeout) -> CommTimeoutError:
    if _AFTER_EARLIER_TIMEOUT.search(str(exc)):
        message = (
            f"rank {rank} cannot run {op} on a group of {group_size} rank(s): an earlier op on "
            f"this group timed out (timeout {describe_timeout(timeout)}) and gloo closed its "
            f"connections. Backend error: {exc}")
    else:
        message = (
            f"rank {rank} timed out in {op} on a group of {group_size} rank(s) after "
            f"{describe_timeout(timeout)}: the other ranks of the group probably never entered "
            f"the same {op} (a collective called on a subset of ranks, or a rank stuck or dead). "
            f"Backend error: {exc}")
    return CommTimeoutError(message, rank=rank, op=op, group_size=group_size, timeout=timeout)
