"""Hook points for the communication logger: observers, records, bandwidth, comms_logger settings.

The logger itself (per-op lines, summaries, stragglers) is a plugin; the core only times each op
and hands a `CommRecord` to whoever registered with `add_comm_observer`. With no observer the ops
are not timed at all, so the device is never synchronised just to measure nothing.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from deepspeed.comm.state import CommsLoggerSettings
from deepspeed.utils.logging import logger

# --------------------------------------------------------------------------- bandwidth formulas
# Op -> formula family, as in the comms-logging tutorial. `size` is the per-rank message in bytes:
# the tensor for all_reduce / broadcast / p2p, each rank's shard for all_gather / reduce_scatter
# (so size * n is the gathered total), the input for all_to_all.
_OP_KIND = {
    "all_reduce": "all_reduce",
    "inference_all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "all_gather",
    "reduce_scatter_tensor": "all_gather",
    "all_to_all_single": "all_to_all",
    "all_to_all": "all_to_all",
}


def bandwidth(op: str, size_bytes: int, latency_s: float, group_size: int):
    """(algbw, busbw) in Gbit/s of one op moving `size_bytes` in `latency_s` on `group_size` ranks.

    all_reduce: algbw = 2*size/t, busbw = size/t * 2(n-1)/n; all_gather & reduce_scatter:
    algbw = size*n/t, busbw = algbw*(n-1)/n; all_to_all: algbw = size/t, busbw = algbw*(n-1)/n;
    everything else (p2p, broadcast, reduce, gather, scatter, barrier): busbw = algbw = size/t.
    """
    if latency_s <= 0 or group_size < 1:
        return 0.0, 0.0
    n = group_size
    per_second = size_bytes / latency_s
    kind = _OP_KIND.get(op, "p2p")
    if kind == "all_reduce":
        algbw, busbw = 2 * per_second, per_second * 2 * (n - 1) / n
    elif kind == "all_gather":
        algbw = per_second * n
        busbw = algbw * (n - 1) / n
    elif kind == "all_to_all":
        algbw = per_second
        busbw = algbw * (n - 1) / n
    else:
        algbw = busbw = per_second
    to_gbps = 8 / 1e9
    return algbw * to_gbps, busbw * to_gbps


@dataclass(frozen=True)
class CommRecord:
    """One completed deepspeed.comm op, as observers receive it."""

    op: str  # the deepspeed.comm function ('all_reduce', 'all_gather_into_tensor', ...)
    log_name: str  # the caller's `log_name=` (defaults to `op`)
    size_bytes: int  # per-rank message size, see `bandwidth`
    latency_s: float  # launch to completion, device synchronised on both ends
    group_size: int
    rank: int  # global rank of the process that made the call
    algbw_gbps: float
    busbw_gbps: float
    async_op: bool = False
    prof: bool = False  # the caller's `prof=True`: log this op even if comms_logger filters it out
    caller: Optional[str] = None  # the function that called deepspeed.comm (for comms_logger.debug)
    group_ranks: Optional[tuple] = None  # global ranks of the group the op ran in (who talked)


# --------------------------------------------------------------------------- observer registry
_lock = threading.Lock()
_observers: tuple = ()
_paused = threading.local()


def add_comm_observer(fn: Callable[[CommRecord], None]) -> None:
    """Call `fn(record)` after every deepspeed.comm op from now on (timing starts with the first).

    An observer may also provide `log_summary(show_straggler=False, return_dict=False)`; that
    method answers `deepspeed.comm.log_summary()`.
    """
    global _observers
    if not callable(fn):
        raise TypeError(f"add_comm_observer() needs a callable taking a CommRecord, got {fn!r}")
    with _lock:
        if fn not in _observers:
            _observers = _observers + (fn,)


def remove_comm_observer(fn) -> None:
    global _observers
    with _lock:
        if fn not in _observers:
            raise ValueError(f"{fn!r} is not a registered comm observer")
        _observers = tuple(o for o in _observers if o != fn)


def comm_observers() -> tuple:
    return _observers


def observing() -> bool:
    """Whether ops must be timed: an observer is registered and this thread did not pause them."""
    return bool(_observers) and not getattr(_paused, "value", False)


@contextmanager
def paused():
    """Ops inside are not observed; for observers that communicate themselves (straggler min)."""
    previous = getattr(_paused, "value", False)
    _paused.value = True
    try:
        yield
    finally:
        _paused.value = previous


def emit(record: CommRecord) -> None:
    with paused():  # an observer's own communication must not recurse into itself
        for observer in _observers:
            observer(record)


# --------------------------------------------------------------------------- comms_logger config
_settings = CommsLoggerSettings()  # the live settings configure() updates in place


def comms_logger_settings() -> CommsLoggerSettings:
    return _settings


def _section_of(config):
    """The comms_logger section of a config dict / config object, or None when it has none."""
    if isinstance(config, Mapping):
        section = config.get("comms_logger")
    else:
        section = getattr(config, "comms_logger", None)
    if section is None or isinstance(section, Mapping):
        return section
    if hasattr(section, "model_dump"):
        return section.model_dump()
    return {name: getattr(section, name) for name in CommsLoggerSettings.model_fields
            if hasattr(section, name)}


def configure(config=None, enabled=None, prof_all=None, prof_ops=None, verbose=None, debug=None):
    """Store comms_logger settings: first from `config`'s "comms_logger" section, then keywords;
    then start (enabled) or stop (disabled) the engine-less logger, see below."""
    section = _section_of(config) if config is not None else None
    if section:
        _settings.update(section, "comms_logger.")
    keywords = {"enabled": enabled, "prof_all": prof_all, "prof_ops": prof_ops,
                "verbose": verbose, "debug": debug}
    _settings.update({k: v for k, v in keywords.items() if v is not None}, "configure(): ")
    _sync_configured_logger()


_configured_logger = None  # the CommsLogger configure() registered, while logging is on


def configured_comms_logger():
    """The comms logger ``deepspeed.comm.configure(enabled=True)`` registered (None when off):
    an engine's comms-logger plugin shares it so that no op is logged twice."""
    return _configured_logger


def _sync_configured_logger():
    """Without an engine nobody else observes: enabled, ask the installed plugins for a logger
    (the ``deepspeed_comms_logger`` hook, as for config sections: no engine exists yet) and
    observe with it; disabled, drop that logger again. The core names no plugin."""
    global _configured_logger
    if not _settings.enabled:
        if _configured_logger is not None:
            remove_comm_observer(_configured_logger)
            _configured_logger = None
        return
    if _configured_logger is not None:
        return
    from deepspeed.plugin_manager import PluginCatalog  # lazy: plugins are loaded above comm

    made = PluginCatalog().installed_hook.deepspeed_comms_logger(settings=_settings)
    if made is None:
        logger.warning("comms_logger is enabled but no installed plugin provides a communication "
                       "logger (the deepspeed_comms_logger hook); nothing will be logged")
        return
    _configured_logger = made
    add_comm_observer(made)


def log_summary(show_straggler=False, return_dict=False):
    """Ask the observers that can summarise (the comms logger plugin) for their summary.

    Returns the first non-None answer. With no such observer there is nothing to summarise.
    """
    providers = [o for o in _observers if callable(getattr(o, "log_summary", None))]
    if not providers:
        logger.info("deepspeed.comm.log_summary(): no communication logger is active; enable "
                    "\"comms_logger\": {\"enabled\": true} in the DeepSpeed config")
        return None
    answer = None
    with paused():
        for provider in providers:
            result = provider.log_summary(show_straggler=show_straggler, return_dict=return_dict)
            if answer is None:
                answer = result
    return answer


def reset() -> None:
    """Forget observers and comms_logger settings (between tests sharing one process)."""
    global _observers, _settings, _configured_logger
    with _lock:
        _observers = ()
    _settings = CommsLoggerSettings()
    _configured_logger = None
