"""``deepspeed.module_inject.auto_tp`` (upstream path) -> ``deepspeed.inference.auto_tp``."""
from deepspeed.inference.auto_tp import AutoTP  # noqa: F401
