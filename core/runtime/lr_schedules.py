"""`deepspeed.runtime.lr_schedules` -> `deepspeed.lr_schedules` (the documented import path)."""
from deepspeed.lr_schedules import *  # noqa: F401,F403
from deepspeed.lr_schedules.constants import *  # noqa: F401,F403
