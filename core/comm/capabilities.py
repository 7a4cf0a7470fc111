"""Which collectives the active backend implements, learned on first use.

gloo gained list `all_to_all` and `reduce_scatter` only in recent torch releases, and other
backends have their own gaps. Rather than a table of torch versions (which goes stale), the first
call of an op tries the native collective: a backend that lacks it refuses locally, before any
data moves, so falling back at that point is safe and every rank takes the same path. The answer
is cached per (backend, op) for the life of the process.
"""
import threading
from contextlib import contextmanager
from typing import Callable, Optional

import torch

from deepspeed.comm.errors import is_unsupported_error
from deepspeed.utils.logging import logger

_lock = threading.Lock()
_known = {}  # (backend, op) -> bool
_overrides = {}  # op -> bool, set by tests and by users working around a broken backend


def supported(op: str, backend: str) -> Optional[bool]:
    """True / False once known, None before the first call of `op` on `backend`."""
    if op in _overrides:
        return _overrides[op]
    return _known.get((backend, op))


def known() -> dict:
    return dict(_known)


def _mark(op, backend, value):
    with _lock:
        _known[(backend, op)] = value


@contextmanager
def override(**ops: bool):
    """Pretend the backend does (True) or does not (False) support the named ops.

    `with override(all_to_all=False): ...` forces the fallback, whatever torch offers.
    """
    with _lock:
        saved = dict(_overrides)
        _overrides.update(ops)
    try:
        yield
    finally:
        with _lock:
            _overrides.clear()
            _overrides.update(saved)


def call(op: str, backend: str, native: Callable, fallback: Callable):
    """Run `native()`, or `fallback()` when the backend is known, or found now, to lack `op`."""
    state = supported(op, backend)
    if state is False:
        return fallback()
    try:
        result = native()
    except Exception as exc:
        if state is None and is_unsupported_error(exc):
            _mark(op, backend, False)
            logger.info(f"torch {torch.__version__} backend '{backend}' lacks {op} ({exc}); "
                        f"deepspeed.comm uses an equivalent built from supported collectives")
            return fallback()
        raise
    if state is None:
        _mark(op, backend, True)
    return result


def reset() -> None:
    with _lock:
        _known.clear()
        _overrides.clear()
