"""The ``sequence`` plugin: owns the ``sequence_parallel_size`` config key.

The key only states the intended size; the groups come from the model-parallel unit
(``UlyssesSPAttentionHF.register_with_transformers`` or ``initialize_sequence_parallel`` builds
it, ``deepspeed.initialize(mpu=...)`` registers it). The engine check catches a config that asks
for sequence parallelism nobody set up, which would otherwise train silently as plain data
parallelism on mis-sliced sequences.
"""
from pydantic import PositiveInt

from deepspeed.hooks import hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin

SECTION = "sequence_parallel_size"


class SequenceParallelPlugin(DeepSpeedPlugin):
    config_sections = {SECTION: PositiveInt}
    tested_by = {SECTION: "tests/plugins/sequence/test_sequence_engine.py::"
                          "test_config_without_sequence_groups_is_a_clear_error"}

    def is_enabled(self, config, sections):
        return config.has_section(SECTION)

    @hookimpl
    def deepspeed_engine_init(self, engine, config):
        wanted = config.section(SECTION)
        if wanted == 1:
            return
        # imported here: the topology imports torch, and the launcher loads this plugin (for its
        # flags) without torch
        from deepspeed import topology

        actual = topology.current().size("sequence")
        if actual != wanted:
            raise ValueError(
                f'config "{SECTION}": {wanted}, but the registered model-parallel unit reports a '
                f"sequence-parallel world size of {actual}. Build the groups with "
                f"UlyssesSPAttentionHF.register_with_transformers(..., sequence_parallel_size="
                f"{wanted}) (or deepspeed.runtime.sequence_parallel.parallel_state_sp."
                f"initialize_sequence_parallel({wanted})) and pass the returned mpu to "
                f"deepspeed.initialize(mpu=...)")
