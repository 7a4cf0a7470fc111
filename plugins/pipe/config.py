"""The ``pipeline`` config section.

Upstream parses it, but the pipeline's shape comes from ``PipelineModule``'s arguments
(``num_stages``, ``partition_method``, ``seed_layers``, ``activation_checkpoint_interval``),
and the pipeline engine sends activations and their gradients whole between stages (it does
not split them over a stage's tensor-parallel ranks); so every key is accepted and, set to
anything but its default, warned about once (the ``without_effect`` table).
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
        "pipe_partitioned": "the pipeline engine sends each activation whole from stage to "
                            "stage; it does not split it over the stage's tensor-parallel ranks",
        "grad_partitioned": "the pipeline engine sends each activation gradient whole from "
                            "stage to stage; it does not split it over the stage's "
                            "tensor-parallel ranks",
    }
