"""The ``pipeline`` config section.

``stages``, ``partition``, ``seed_layers`` and ``activation_checkpoint_interval`` fill in the
``PipelineModule`` arguments left at their defaults (``num_stages`` / ``topology``,
``partition_method``, ``seed_layers``, ``activation_checkpoint_interval``) when
``deepspeed.initialize`` receives the module; a key contradicting an argument given is an
error naming both (``PipelineModule.apply_pipeline_config``). A module built without
``num_stages`` / ``topology`` takes its stages from ``stages``. ``partition: "best"`` (the
default) keeps the module's ``partition_method``. ``pipe_partitioned`` / ``grad_partitioned``
split activations / their gradients over a stage's tensor-parallel ranks on the wire
(``p2p.TensorSplit``); without tensor parallelism in a stage they change nothing.
"""
from typing import Literal, Union

from deepspeed.config import DeepSpeedConfigModel

CONFIG_TEST = "tests/plugins/pipe/test_pipeline_config.py::"
LAID_OUT = CONFIG_TEST + "test_the_pipeline_section_lays_out_a_module_left_at_its_defaults"
SPLIT = (CONFIG_TEST
         + "test_partitioned_activations_and_gradients_cross_stages_in_tensor_parallel_shares")


class PipelineConfig(DeepSpeedConfigModel):
    tested_by = dict.fromkeys(("stages", "partition", "seed_layers",
                               "activation_checkpoint_interval"), LAID_OUT)
    # without tensor parallelism in a stage (tp = 1) both are a no-op by definition
    tested_by.update(dict.fromkeys(("pipe_partitioned", "grad_partitioned"), SPLIT))

    stages: Union[Literal["auto"], int] = "auto"
    """Pipeline stages of a PipelineModule built without num_stages / topology ("auto": the
    module's)."""
    partition: str = "best"
    """The partition method ('parameters', 'uniform', 'type:<regex>') of a module left at its
    default ('parameters'); "best" keeps the module's."""
    seed_layers: bool = False
    """Build layer i under seed base_seed + i (as the module's seed_layers=True)."""
    activation_checkpoint_interval: int = 0
    """Checkpoint every N layers of a module left at interval 0 (0: the module's)."""
    pipe_partitioned: bool = True
    """With tensor parallelism in a stage, each tensor-parallel rank sends 1/tp of every
    activation to the next stage, which all-gathers it (without it: nothing to split)."""
    grad_partitioned: bool = True
    """The same for the activation gradients sent back to the previous stage."""
