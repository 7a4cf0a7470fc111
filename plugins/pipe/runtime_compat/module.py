"""``deepspeed.runtime.pipe.module`` -> ``deepspeed.pipe.module``."""
from deepspeed.pipe.module import *  # noqa: F401,F403
from deepspeed.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec  # noqa: F401
