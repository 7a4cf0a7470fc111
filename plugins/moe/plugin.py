"""The ``moe`` plugin: takes part in every engine whose model holds MoE layers.

Mixture of experts trains through declarations the core and ZeRO understand: a
``deepspeed.moe.layer.MoE`` tags its expert parameters with their expert-data-parallel group
(``deepspeed.hooks.GRADIENT_GROUP``: gradients summed there, ZeRO-1/2 partitions laid out
there) and their expert-parallel group (``GRADIENT_NORM_GROUP``: the ranks holding the other
experts, over which clipping sums their norm). The plugin tags them at engine init, before
ZeRO wraps the optimizer, and refuses what still does not know expert groups with experts split
over ranks (``ep_size > 1``): ZeRO-3, which shards every parameter over the whole
data-parallel group.

Checkpoints (``deepspeed.moe.checkpoint``): every expert goes into a file of its own, next to
the model states (which then hold no expert), so the weights load at any ``ep_size``; with
experts split over ranks and no ZeRO, the optimizer state is saved per expert-parallel rank and
loads at the same layout. A universal checkpoint (``ds_to_universal``: every expert under its
global id) loads at any ``ep_size``: the plugin names each rank's expert parameters by their
global ids (``deepspeed.hooks.UNIVERSAL_CHECKPOINT_NAME``) and cuts the module weights.

How it is enabled: there is no MoE config section (upstream has none; the layer's arguments
say everything), and the engine class is not the plugin's to claim (the pipeline plugin may
claim it), so it answers ``deepspeed_enable_for_model`` for a model holding MoE layers.
``ep_size == 1`` experts are replicated like dense weights, so everything works for them.
"""
from deepspeed.hooks import hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin
from deepspeed.utils.lazy_module import lazy_module

nn = lazy_module("torch.nn")  # loaded on first use (the launcher imports this plugin without torch)


def expert_parallel_layers(module):
    """``[(name, MoE)]`` of the layers whose experts are split over several ranks."""
    from deepspeed.moe.layer import MoE

    return [(name, m) for name, m in module.named_modules()
            if isinstance(m, MoE) and m.ep_size > 1]


def all_moe_layers(module):
    from deepspeed.moe.layer import MoE

    return [(name, m) for name, m in module.named_modules() if isinstance(m, MoE)]


def _describe(layers):
    name, layer = layers[0]
    return (f"MoE layer '{name or '<model>'}' (ep_size={layer.ep_size}, "
            f"num_experts={layer.num_experts})")


def check_moe_compatible(module, zero_stage, clipping=None):
    """Raise ``NotImplementedError`` naming the layer and the feature when ``module`` holds
    expert-parallel MoE layers and the engine uses a feature that cannot handle them: ZeRO
    stage 3, which shards every parameter over the whole data-parallel group (an expert's
    shards would mix the different experts that ranks hold in the same slot), z3 leaf or not.
    ZeRO 1/2 partition expert param groups over their expert-data-parallel group and gradient
    clipping sums expert norms over the expert-parallel group (``GRADIENT_NORM_GROUP``)."""
    from deepspeed import topology

    layers = expert_parallel_layers(module)
    from deepspeed.moe.groups import tensor_dim

    tp = topology.current().size(tensor_dim())
    if zero_stage >= 3 and tp > 1 and not layers:
        replicated = [(name, m) for name, m in all_moe_layers(module)
                      if not m.enable_expert_tensor_parallelism]
        if replicated:
            raise NotImplementedError(
                f"ZeRO stage 3 is not supported with {_describe(replicated)} under tensor "
                f"parallelism (model-parallel size {tp}) with "
                f"enable_expert_tensor_parallelism=False: each tensor-parallel rank runs a "
                f"slice of the tokens through its copy of the experts, so their gradients are "
                f"summed over the tensor-parallel ranks too, which ZeRO-3 does not do; use "
                f"zero_optimization.stage 1 or 2")
    if not layers:
        return
    where = _describe(layers)
    if zero_stage >= 3:
        raise NotImplementedError(
            f"ZeRO stage 3 is not supported with expert parallelism: {where} holds different "
            f"experts on different ranks, and ZeRO-3 shards each parameter over the whole "
            f"data-parallel group, so one expert's shards would mix with other experts' "
            f"(marking the MoE block a z3 leaf with deepspeed.utils.set_z3_leaf_modules does "
            f"not change how it is sharded); use zero_optimization.stage 1 or 2, or ep_size=1")


def tag_expert_groups(module):
    """Build every MoE layer's process groups and tag its experts now (collective, in module
    order on every rank), so ZeRO sees ``GRADIENT_GROUP`` when it partitions the optimizer."""
    from deepspeed.moe.layer import MoE

    for layer in module.modules():
        if isinstance(layer, MoE):  # ep_size 1 too: with tensor parallelism it needs groups
            layer.set_deepspeed_parallelism()


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
        from deepspeed.moe.checkpoint import name_experts_globally

        check_moe_compatible(engine.module, engine.sharding.stage, config.gradient_clipping)
        tag_expert_groups(engine.module)
        name_experts_globally(engine.module)  # how universal checkpoints name this rank's

    # ------------------------------------------------------------------ checkpoints
    @hookimpl
    def deepspeed_save_optimizer_state(self, engine, checkpoint_dir):
        from deepspeed.moe.checkpoint import save_optimizer_state

        return save_optimizer_state(engine, checkpoint_dir)

    @hookimpl
    def deepspeed_save_checkpoint(self, engine, checkpoint_dir, state, exclude_frozen_parameters):
        from deepspeed.moe.checkpoint import save_experts

        save_experts(engine, checkpoint_dir, state, exclude_frozen_parameters)

    @hookimpl
    def deepspeed_load_module_state(self, engine, state_dict, checkpoint_dir, state):
        from deepspeed.moe.checkpoint import load_experts

        return load_experts(engine, state_dict, checkpoint_dir, state)

    @hookimpl(tryfirst=True)
    def deepspeed_load_optimizer_state(self, engine, checkpoint_dir, state):
        """Refused across expert layouts before any plugin reads its optimizer files."""
        from deepspeed.moe.checkpoint import load_optimizer_state

        return load_optimizer_state(engine, checkpoint_dir, state)
