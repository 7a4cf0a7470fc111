"""The ``pipe`` plugin: claims a ``PipelineModule`` for the ``PipelineEngine``.

Enabled by the model, not the config: ``deepspeed.initialize`` asks every installed plugin
``deepspeed_engine_for_model`` and this one answers for a ``PipelineModule`` (or a wrapper
exposing one as ``.wrapped``) with its engine class and the module's process grid, which
then also sizes the config's batch arithmetic (data-parallel size = world / stages). It owns
the ``pipeline`` config section, whose keys the module's arguments decide.
"""
from deepspeed.hooks import EngineChoice, hookimpl
from deepspeed.pipe.config import PipelineConfig
from deepspeed.plugin_manager import DeepSpeedPlugin


def _pipeline_module(model):
    from deepspeed.pipe.module import PipelineModule

    if isinstance(model, PipelineModule):
        return model
    wrapped = getattr(model, "wrapped", None)
    return wrapped if isinstance(wrapped, PipelineModule) else None


class PipePlugin(DeepSpeedPlugin):
    config_sections = {"pipeline": PipelineConfig}
    enabled_by = "a PipelineModule passed to deepspeed.initialize"

    def is_enabled(self, config, sections):
        return False  # only through deepspeed_engine_for_model

    @hookimpl
    def deepspeed_engine_for_model(self, model):
        module = _pipeline_module(model)
        if module is None:
            return None
        from deepspeed.pipe.engine import PipelineEngine

        return EngineChoice(engine_class=PipelineEngine, mpu=module.mpu())

    @hookimpl
    def deepspeed_engine_init(self, engine, config):
        from deepspeed.pipe.engine import check_pipeline_compatible

        check_pipeline_compatible(engine)
