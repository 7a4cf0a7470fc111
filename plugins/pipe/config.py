"""The ``pipeline`` config section.

Upstream parses it, but the pipeline's shape comes from ``PipelineModule``'s arguments
(``num_stages``, ``partition_method``, ``seed_layers``, ``activation_checkpoint_interval``),
and activation / gradient partitioning across tensor-parallel ranks needs a tensor-parallel
plugin this build does not ship; so every key is accepted and, set to anything but its default,
warned about once (the ``without_effect`` table).
"""
from typing import Literal, Union

from deepspeed.config import DeepSpeedConfigModel

_FROM_MODULE = "the PipelineModule's {} argument decides this"


class PipelineConfig(DeepSpeedConfigModel):
    stages: Union[Literal["auto"], int] = "auto"
    partition: str = "best"
    seed_layers: bool = False
    activation_checkpoint_interval: int = 0
    pipe_partitioned: bool = True
    grad_partitioned: bool = True

    without_effect = {
        "stages": _FROM_MODULE.format("num_stages / topology"),
        "partition": _FROM_MODULE.format("partition_method"),
        "seed_layers": _FROM_MODULE.format("seed_layers"),
        "activation_checkpoint_interval": _FROM_MODULE.format("activation_checkpoint_interval"),
        "pipe_partitioned": "activations are partitioned across tensor-parallel ranks only, "
                            "and no tensor-parallel plugin is installed",
        "grad_partitioned": "gradients are partitioned across tensor-parallel ranks only, "
                            "and no tensor-parallel plugin is installed",
    }
