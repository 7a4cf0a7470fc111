"""``deepspeed.runtime.pipe.topology`` -> ``deepspeed.pipe.topology``."""
from deepspeed.pipe.topology import *  # noqa: F401,F403
from deepspeed.pipe.topology import (PipeDataParallelTopology,  # noqa: F401
                                     PipelineParallelGrid, PipeModelDataParallelTopology,
                                     ProcessTopology)
