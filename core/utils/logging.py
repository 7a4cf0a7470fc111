"""One named logger for the whole package, with a rank-aware helper.

Multi-rank runs print everything N times unless messages say which ranks should speak;
`log_dist` is the one place that decides.

This module sits at the bottom of the import graph: it imports nothing from `deepspeed`, because
almost every module (`deepspeed.comm` and the accelerators included) logs through it. The rank
`log_dist` needs therefore flows upwards by registration instead of by import: `deepspeed.comm`,
the only door to torch.distributed, hands its rank lookup to `set_rank_source` when it is imported.
Until then (or while no process group is up) the launcher's `RANK` variable is the rank. The
other direction, this module importing `deepspeed.comm`, would make the logger depend on the
whole communication stack and the accelerator behind it, which all log through this module.
"""
import logging
import os
import sys

LOG_FORMAT = "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"


def _create_logger(name="DeepSpeed", level=logging.INFO):
    log = logging.getLogger(name)
    if not log.handlers:
        handler = logging.StreamHandler(stream=sys.stdout)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        log.addHandler(handler)
    log.setLevel(os.environ.get("DS_LOG_LEVEL", logging.getLevelName(level)).upper())
    log.propagate = False
    return log


logger = _create_logger()


_rank_source = None  # set by deepspeed.comm: () -> this process's rank, or None without a group


def set_rank_source(source):
    """Make `source()` the rank `log_dist` reports: an int, or None when no process group is up
    (then `RANK` from the environment is used). `None` unregisters; returns the previous source."""
    global _rank_source
    if source is not None and not callable(source):
        raise TypeError(f"set_rank_source() needs a callable or None, got {source!r}")
    previous, _rank_source = _rank_source, source
    return previous


def current_rank():
    """This process's rank: the process group's when ``deepspeed.comm`` registered it, else the
    launcher's ``RANK`` (0 without one)."""
    rank = _rank_source() if _rank_source is not None else None
    if rank is not None:
        return rank
    return int(os.environ.get("RANK", "0"))


def local_rank():
    """This process's rank on its node: the launcher's ``LOCAL_RANK`` (0 without one)."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def log_per_node(message, level=logging.INFO):
    """Log `message` from local rank 0 only: start-up facts that are the same for every process
    of a node (the backend, a native op's SIMD level) are said once per node, not once per rank."""
    if local_rank() == 0:
        logger.log(level, message, stacklevel=2)


def log_dist(message, ranks=(0,), level=logging.INFO):
    """Log `message` on the given ranks only; `ranks=None` or containing -1 means every rank."""
    rank = current_rank()
    if ranks is None or -1 in ranks or rank in ranks:
        logger.log(level, f"[Rank {rank}] {message}", stacklevel=2)
