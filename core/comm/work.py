"""Handles returned by async deepspeed.comm ops.

An async op's timeout surfaces only at `wait()`, and its latency is known only then, so the torch
`Work` is wrapped: `wait()` translates timeouts into `CommTimeoutError` and reports the finished
op to the comm observers. Everything else is delegated to the torch object.
"""
import torch

from deepspeed.comm.errors import is_timeout_error


class CompletedWork:
    """Stands in for torch's Work when a fallback already finished the op synchronously."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        return []

    def synchronize(self):
        return None

    def get_future(self):
        future = torch.futures.Future()
        future.set_result([])
        return future


def finished(async_op):
    """What an op that already completed synchronously returns: a ``CompletedWork`` when the
    caller asked for ``async_op``, else None (torch's convention)."""
    return CompletedWork() if async_op else None


class WorkHandle:
    """A torch Work whose `wait()` reports completion and raises `CommTimeoutError` on timeouts."""

    def __init__(self, work, on_timeout, on_complete=None):
        self._work = work
        self._on_timeout = on_timeout  # exc -> CommTimeoutError
        self._on_complete = on_complete  # called once, after the first successful wait

    def wait(self, timeout=None):
        try:
            done = self._work.wait() if timeout is None else self._work.wait(timeout)
        except RuntimeError as exc:
            if is_timeout_error(exc):
                raise self._on_timeout(exc) from exc
            raise
        if self._on_complete is not None:
            callback, self._on_complete = self._on_complete, None
            callback()
        return done

    def __getattr__(self, name):
        return getattr(self.__dict__["_work"], name)

    def __repr__(self):
        return f"WorkHandle({self._work!r})"
