"""The ``inference`` plugin: answers ``deepspeed.init_inference`` through the
``deepspeed_init_inference`` hook (the core never imports this package).

It owns no training-config section: inference has its own config, built per call from a dict,
a JSON path and keyword arguments (``deepspeed.inference.config``)."""
from deepspeed.hooks import hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin


def init_inference(model, config=None, **kwargs):
    """Build an ``InferenceEngine`` for ``model`` from ``config`` merged with ``kwargs``."""
    from deepspeed.inference.config import DeepSpeedInferenceConfig, load_config, merge_config
    from deepspeed.inference.engine import InferenceEngine

    if isinstance(config, DeepSpeedInferenceConfig):
        if kwargs:
            merged = merge_config(config.model_dump(exclude_unset=True), kwargs)
            config = DeepSpeedInferenceConfig(**merged)
        explicit = set(config.model_fields_set)
    else:
        merged = merge_config(config, kwargs)
        explicit = set(merged)
        config = DeepSpeedInferenceConfig(**merged)
    from deepspeed.config.without_effect import warn_without_effect

    warn_without_effect(config, "init_inference")  # keys without effect here: once, with why
    return InferenceEngine(model, config, explicit=explicit)


class InferencePlugin(DeepSpeedPlugin):
    enabled_by = "deepspeed.init_inference"
    # AutoTP, the split layers and sharding; the MoE layer (expert-parallel inference)
    depends_on = ("tensor_parallel", "moe")

    def is_enabled(self, config, sections):
        return False  # never part of a training engine

    @hookimpl
    def deepspeed_init_inference(self, model, config, kwargs):
        return init_inference(model, config, **kwargs)
