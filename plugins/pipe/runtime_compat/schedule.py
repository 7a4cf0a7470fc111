"""``deepspeed.runtime.pipe.schedule`` -> ``deepspeed.pipe.schedule``."""
from deepspeed.pipe.schedule import *  # noqa: F401,F403
