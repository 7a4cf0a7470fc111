"""The ``domino`` plugin: an engine whose model holds Domino layers trains tensor parallel.

Domino has no training-config section (its knobs are the layers' constructor arguments), so
the plugin takes part through the model (``deepspeed_enable_for_model``: the model holds a
``DominoTransformerLayer``) and hands the engine the layers' tensor x data parallel unit
(``deepspeed_model_parallel_unit``): gradients are then averaged over the data-parallel group
only, never over the tensor-parallel ranks that hold different slices, and the global
gradient norm sums over the tensor-parallel group with each replicated parameter (LayerNorms,
row-parallel biases, the model's embeddings) counted once (``REPLICATED_PARAM`` on the copies
of tensor-parallel ranks other than 0). Without it, ``deepspeed.initialize`` with no ``mpu``
would average the slices of different ranks together.
"""
from deepspeed.hooks import REPLICATED_PARAM, hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin


def domino_unit(model):
    """The tensor-parallel unit of the Domino layers in ``model``, or None if it has none."""
    from torch import nn

    from deepspeed.domino.transformer import DominoTransformerLayer

    if not isinstance(model, nn.Module):
        return None
    units = {id(m.tensor_parallel_unit): m.tensor_parallel_unit for m in model.modules()
             if isinstance(m, DominoTransformerLayer)}
    if len(units) > 1:
        raise ValueError("the model's Domino layers were built over different tensor-parallel "
                         "units; build them all with the same mpu")
    return next(iter(units.values()), None)


class DominoPlugin(DeepSpeedPlugin):
    enabled_by = "a model holding DominoTransformerLayer modules"
    depends_on = ("tensor_parallel",)  # its layers and groups

    def is_enabled(self, config, sections):
        return False  # only through the model

    @hookimpl
    def deepspeed_enable_for_model(self, model):
        return domino_unit(model) is not None

    @hookimpl
    def deepspeed_model_parallel_unit(self, engine, config, mpu):
        unit = domino_unit(engine.module)
        if unit is None:
            return None
        if engine.zero_optimization_stage() >= 3:
            raise NotImplementedError(
                "Domino together with ZeRO stage 3 is not supported: ZeRO-3 would partition the "
                "tensor-parallel slices again; use zero_optimization.stage 0, 1 or 2")
        if mpu is not None and mpu is not unit:
            mine = unit.get_tensor_model_parallel_group()
            theirs = mpu.get_model_parallel_group() if hasattr(mpu, "get_model_parallel_group") \
                else None
            if theirs is not mine:
                raise ValueError("deepspeed.initialize was given an mpu whose model-parallel "
                                 "group is not the one the Domino layers were built over; pass "
                                 "the same mpu to both, or none to deepspeed.initialize")
            unit = mpu
        if unit.get_tensor_model_parallel_rank() != 0:
            # imported here: the package's layers import torch, and the launcher loads this
            # plugin (for its flags) without torch
            from deepspeed.tensor_parallel import TENSOR_MODEL_PARALLEL

            for param in engine.module.parameters():
                if not getattr(param, TENSOR_MODEL_PARALLEL, False):
                    setattr(param, REPLICATED_PARAM, True)
        return unit
