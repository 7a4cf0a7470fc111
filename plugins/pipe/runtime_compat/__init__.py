"""``deepspeed.runtime.pipe``: upstream's path of the pipeline plugin."""
from deepspeed.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec  # noqa: F401
from deepspeed.pipe.topology import (PipeDataParallelTopology,  # noqa: F401
                                     PipeModelDataParallelTopology, ProcessTopology)

from deepspeed.utils.lazy_exports import lazy_exports  # noqa: E402

# submodules load on first attribute access (`deepspeed.x.y.z` after a plain `import deepspeed`)
__getattr__, __dir__ = lazy_exports(__name__)
