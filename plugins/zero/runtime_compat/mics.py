"""``deepspeed.runtime.zero.mics`` (upstream path): MiCS's ``MiCS_Init``."""
from deepspeed.zero.mics import MiCS_Init  # noqa: F401
