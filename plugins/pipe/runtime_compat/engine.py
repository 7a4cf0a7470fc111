"""``deepspeed.runtime.pipe.engine`` -> ``deepspeed.pipe.engine``."""
from deepspeed.pipe.engine import PipelineEngine  # noqa: F401
from deepspeed.pipe.p2p import PipelineError  # noqa: F401
