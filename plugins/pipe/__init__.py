"""``deepspeed.pipe``: pipeline parallelism (``PipelineModule``, ``LayerSpec``,
``TiedLayerSpec``, topologies); ``deepspeed.initialize`` returns a ``PipelineEngine`` for a
``PipelineModule`` (see ``plugin.py``). Upstream's ``deepspeed.runtime.pipe.*`` paths live in
``runtime_compat/``."""
import importlib

from deepspeed.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.pipe.topology import (PipeDataParallelTopology, PipelineParallelGrid,
                                     PipeModelDataParallelTopology, ProcessTopology)

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec", "ProcessTopology",
           "PipeDataParallelTopology", "PipeModelDataParallelTopology", "PipelineParallelGrid",
           "PipelineEngine", "PipelineError"]

_LAZY = {"PipelineEngine": "deepspeed.pipe.engine", "PipelineError": "deepspeed.pipe.p2p"}


def __getattr__(name):
    """The engine imports the whole core engine: loaded on first use, not with the layers."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module '{__name__}' has no attribute '{name}'")
