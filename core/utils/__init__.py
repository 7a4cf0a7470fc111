"""Small shared helpers (`deepspeed.utils`)."""
from deepspeed.utils.logging import log_dist, logger

__all__ = ["logger", "log_dist"]
