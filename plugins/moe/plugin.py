"""The ``moe`` plugin: takes part in every engine whose model holds MoE layers, to refuse what
does not know expert groups yet.

Mixture of experts needs no engine hook to train: a ``deepspeed.moe.layer.MoE`` tags its
expert parameters with their expert-data-parallel group (``deepspeed.hooks.GRADIENT_GROUP``)
and the core's gradient all-reduce honours the tag. What it cannot do yet, with experts split
over ranks (``ep_size > 1``):

- ZeRO stages 1-3 partition and reduce gradients over the whole data-parallel group, which
  would average each expert's gradient with other experts' (silently wrong weights);
- gradient clipping measures the norm of this rank's gradients only, and with experts split
  over ranks the norms, hence the clipped dense gradients, would differ between ranks;
- checkpoints: the model states are written by data-parallel rank 0 only, so the experts the
  other ranks hold would be lost (per-expert files are the next part of this plugin).

How it is enabled: there is no MoE config section (upstream has none; the layer's arguments
say everything), and the engine class is not the plugin's to claim (the pipeline plugin may
claim it), so it answers ``deepspeed_enable_for_model`` for a model holding MoE layers.
``ep_size == 1`` experts are replicated like dense weights, so everything works for them.
"""
from torch import nn

from deepspeed.hooks import hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin


def expert_parallel_layers(module):
    """``[(name, MoE)]`` of the layers whose experts are split over several ranks."""
    from deepspeed.moe.layer import MoE

    return [(name, m) for name, m in module.named_modules()
            if isinstance(m, MoE) and m.ep_size > 1]


def _describe(layers):
    name, layer = layers[0]
    return (f"MoE layer '{name or '<model>'}' (ep_size={layer.ep_size}, "
            f"num_experts={layer.num_experts})")


def check_moe_compatible(module, zero_stage, clipping):
    """Raise ``NotImplementedError`` naming the layer and the feature when ``module`` holds
    expert-parallel MoE layers and the engine uses a feature that cannot handle them."""
    layers = expert_parallel_layers(module)
    if not layers:
        return
    where = _describe(layers)
    if zero_stage >= 1:
        raise NotImplementedError(
            f"ZeRO stage {zero_stage} is not supported with expert parallelism yet: {where} "
            f"needs its expert gradients averaged over the expert-data-parallel group, which "
            f"ZeRO's partitions do not know; use zero_optimization.stage 0 or ep_size=1")
    if clipping and clipping > 0:
        raise NotImplementedError(
            f"gradient_clipping={clipping} is not supported with expert parallelism yet: "
            f"{where} holds different experts on different ranks, so the local gradient norm "
            f"the clipping uses differs between ranks; set gradient_clipping to 0 or ep_size=1")


class MoEPlugin(DeepSpeedPlugin):
    enabled_by = "a model holding deepspeed.moe.layer.MoE layers"

    def is_enabled(self, config, sections):
        return False  # only through deepspeed_enable_for_model

    @hookimpl
    def deepspeed_enable_for_model(self, model):
        from deepspeed.moe.utils import has_moe_layers

        return isinstance(model, nn.Module) and has_moe_layers(model)[0]

    @hookimpl
    def deepspeed_engine_init(self, engine, config):
        check_moe_compatible(engine.module, engine.sharding.stage, config.gradient_clipping)

    @hookimpl
    def deepspeed_save_checkpoint(self, engine, checkpoint_dir):
        layers = expert_parallel_layers(engine.module)
        if layers:  # raised before any file is written: the save fails on every rank
            raise NotImplementedError(
                f"save_checkpoint '{checkpoint_dir}': {_describe(layers)} splits its experts "
                f"over ranks, and per-expert checkpoint files are not implemented yet (the "
                f"model states hold data-parallel rank 0's experts only); nothing was saved")
