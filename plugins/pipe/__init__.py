"""``deepspeed.pipe``: pipeline parallelism (``PipelineModule``, ``LayerSpec``,
``TiedLayerSpec``, topologies); ``deepspeed.initialize`` returns a ``PipelineEngine`` for a
``PipelineModule`` (see ``plugin.py``). Upstream's ``deepspeed.runtime.pipe.*`` paths live in
``runtime_compat/``."""

from deepspeed.utils.lazy_exports import lazy_exports

_EXPORTS = {
    "PipelineModule": "deepspeed.pipe.module",
    "LayerSpec": "deepspeed.pipe.module",
    "TiedLayerSpec": "deepspeed.pipe.module",
    "ProcessTopology": "deepspeed.pipe.topology",
    "PipeDataParallelTopology": "deepspeed.pipe.topology",
    "PipeModelDataParallelTopology": "deepspeed.pipe.topology",
    "PipelineParallelGrid": "deepspeed.pipe.topology",
    "PipelineEngine": "deepspeed.pipe.engine",
    "PipelineError": "deepspeed.pipe.p2p",
}

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec", "ProcessTopology",
           "PipeDataParallelTopology", "PipeModelDataParallelTopology", "PipelineParallelGrid",
           "PipelineEngine", "PipelineError"]

# loaded on first use: the plugin catalog imports this package with every run (see lazy_exports)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
