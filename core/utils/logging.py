"""One named logger for the whole package, with a rank-aware helper.

Multi-rank runs print everything N times unless messages say which ranks should speak;
`log_dist` is the one place that decides.
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


def _current_rank():
    from deepspeed import comm  # here, not at the top: deepspeed.comm logs through this module

    if comm.is_initialized():
        return comm.get_rank()
    return int(os.environ.get("RANK", "0"))


def log_dist(message, ranks=(0,), level=logging.INFO):
    """Log `message` on the given ranks only; `ranks=None` or containing -1 means every rank."""
    rank = _current_rank()
    if ranks is None or -1 in ranks or rank in ranks:
        logger.log(level, f"[Rank {rank}] {message}", stacklevel=2)
