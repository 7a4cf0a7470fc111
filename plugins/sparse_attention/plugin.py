"""The ``sparse_attention`` plugin: owns the ``sparse_attention`` config section.

Sparse attention lives in the model (``SparseSelfAttention`` modules), so the engine has nothing
to drive; the plugin validates the section at ``deepspeed.initialize`` (a bad mode or key
combination fails there, naming the key, rather than when the model first asks) and keeps the
validated section for ``get_sparse_attention_config(engine, num_heads)``.
"""
from deepspeed.hooks import hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin
from deepspeed.sparse_attention.config import SECTION, SparseAttentionConfig


class SparseAttentionPlugin(DeepSpeedPlugin):
    config_sections = {SECTION: SparseAttentionConfig}

    @hookimpl
    def deepspeed_engine_init(self, engine, config):
        section = config.section(SECTION)
        if section is not None:
            section.sparsity_config(num_heads=max(section.num_different_global_patterns, 1))
