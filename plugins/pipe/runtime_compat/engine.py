"""``deepspeed.runtime.pipe.engine`` -> ``deepspeed.pipe.engine``. The API reference's index
lists ``PipeSchedule`` in this module too (the engine runs its schedules), so it is here as well
as in ``deepspeed.runtime.pipe.schedule``."""
from deepspeed.pipe.engine import PipelineEngine  # noqa: F401
from deepspeed.pipe.p2p import PipelineError  # noqa: F401
from deepspeed.pipe.schedule import PipeSchedule  # noqa: F401
