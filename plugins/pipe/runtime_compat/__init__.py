"""``deepspeed.runtime.pipe``: upstream's path of the pipeline plugin."""
from deepspeed.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec  # noqa: F401
from deepspeed.pipe.topology import (PipeDataParallelTopology,  # noqa: F401
                                     PipeModelDataParallelTopology, ProcessTopology)
