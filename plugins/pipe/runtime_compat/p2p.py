"""``deepspeed.runtime.pipe.p2p`` -> ``deepspeed.pipe.p2p``."""
from deepspeed.pipe.p2p import *  # noqa: F401,F403
from deepspeed.pipe.p2p import PipelineError, StageLink  # noqa: F401
