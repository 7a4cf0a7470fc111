"""The ``pipe`` plugin: claims a ``PipelineModule`` for the ``PipelineEngine``.

Enabled by the model, not the config: ``deepspeed.initialize`` asks every installed plugin
``deepspeed_engine_for_model`` and this one answers for a ``PipelineModule`` (or a wrapper
exposing one as ``.wrapped``) with its engine class and the module's process grid, which
then also sizes the config's batch arithmetic (data-parallel size = world / stages). It owns
the ``pipeline`` config section: ``stages``, ``partition``, ``seed_layers`` and
``activation_checkpoint_interval`` fill in the module's arguments left at their defaults
(``PipelineModule.apply_pipeline_config``); ``pipe_partitioned`` / ``grad_partitioned`` split
what crosses a stage boundary over the stage's tensor-parallel ranks (``p2p``).

Checkpoints: ``save_checkpoint`` writes each layer into ``layer_XX-model_states.pt`` (global
layer index; data-parallel rank 0 of each stage writes its layers) and each stage's
``mp_rank_XX_model_states.pt`` holds ``module: None`` and ``pipeline_stages``. The weights load
at any number of stages; the optimizer state only at the number it was saved with. A universal
checkpoint (``ds_to_universal`` of a pipeline, tensor-parallel or plain checkpoint) loads at
any number of stages and tensor-parallel size, optimizer state included: each stage reads its
own parameters by their global names (``universal_names``) and the core cuts each rank's
tensor-parallel piece.
"""
import sys

from deepspeed.hooks import (UNIVERSAL_CHECKPOINT_NAME, UNIVERSAL_CHECKPOINT_SLICE,
                             EngineChoice, hookimpl)
from deepspeed.pipe.config import PipelineConfig
from deepspeed.plugin_manager import DeepSpeedPlugin

# the model-states file entry recording the number of stages the checkpoint was saved with
PIPELINE_STAGES_KEY = "pipeline_stages"


def _pipeline_module(model):
    # asked of every model by the catalog: while ``deepspeed.pipe.module`` is not imported no
    # PipelineModule exists, and a run without pipelines does not import the pipeline library
    module = sys.modules.get("deepspeed.pipe.module")
    if module is None:
        return None
    if isinstance(model, module.PipelineModule):
        return model
    wrapped = getattr(model, "wrapped", None)
    return wrapped if isinstance(wrapped, module.PipelineModule) else None


# Megatron's attributes on a parameter split over the tensor-parallel (``model``) axis
MEGATRON_SPLIT, MEGATRON_DIM = "tensor_model_parallel", "partition_dim"


def universal_names(engine):
    """Prepare the stage's parameters for universal checkpoints. With several stages each
    holds a part of the model: every parameter declares its global name
    (``UNIVERSAL_CHECKPOINT_NAME``), which tells universal loaders a group may hold a part of
    the checkpoint's. A parameter Megatron-style layers split over the grid's ``model`` axis
    (``tensor_model_parallel``, ``partition_dim``) declares its piece
    (``UNIVERSAL_CHECKPOINT_SLICE``) unless its layer did."""
    grid = engine.mpu
    parts, index = grid.get_slice_parallel_world_size(), grid.get_slice_parallel_rank()
    stages = grid.get_pipe_parallel_world_size()
    for name, param in engine.module.named_parameters():
        if stages > 1 and not hasattr(param, UNIVERSAL_CHECKPOINT_NAME):
            setattr(param, UNIVERSAL_CHECKPOINT_NAME, name)
        if parts > 1 and getattr(param, MEGATRON_SPLIT, False) and \
                not hasattr(param, UNIVERSAL_CHECKPOINT_SLICE):
            setattr(param, UNIVERSAL_CHECKPOINT_SLICE,
                    (int(getattr(param, MEGATRON_DIM, 0)), parts, index))


def pipeline_section(config):
    """The config's ``pipeline`` section validated (errors name the key, as the whole
    config's validation would), or its defaults."""
    from deepspeed.config.validation import validate_config

    raw = config.get("pipeline")
    if raw is None:
        return PipelineConfig()
    return validate_config({"pipeline": raw}, {"pipeline": PipelineConfig})[1]["pipeline"]


class PipePlugin(DeepSpeedPlugin):
    config_sections = {"pipeline": PipelineConfig}
    enabled_by = "a PipelineModule passed to deepspeed.initialize"

    def is_enabled(self, config, sections):
        return False  # only through deepspeed_engine_for_model

    @hookimpl
    def deepspeed_engine_for_model(self, model, config):
        module = _pipeline_module(model)
        if module is None:
            return None
        from deepspeed.pipe.engine import PipelineEngine

        # the section lays the module out before the engine (and the batch arithmetic, which
        # needs its data-parallel size) exists; validated here with the model's own rules
        section = pipeline_section(config)
        module.apply_pipeline_config(stages=section.stages, partition=section.partition,
                                     seed_layers=section.seed_layers,
                                     activation_checkpoint_interval=(
                                         section.activation_checkpoint_interval))

        return EngineChoice(engine_class=PipelineEngine, mpu=module.mpu())

    @hookimpl
    def deepspeed_engine_init(self, engine, config):
        from deepspeed.pipe.engine import check_pipeline_compatible

        check_pipeline_compatible(engine)
        universal_names(engine)


    # ------------------------------------------------------------------ checkpoints
    @hookimpl
    def deepspeed_save_checkpoint(self, engine, checkpoint_dir, state, exclude_frozen_parameters):
        """The layers go into ``layer_XX-model_states.pt`` (``engine.module_state_dict``);
        the model-states file keeps ``module: None`` and the number of stages."""
        engine._curr_ckpt_path = checkpoint_dir
        try:
            engine.module_state_dict(exclude_frozen_parameters=exclude_frozen_parameters)
        finally:
            engine._curr_ckpt_path = None
        state["module"] = None
        state[PIPELINE_STAGES_KEY] = int(engine.num_stages)

    @hookimpl
    def deepspeed_model_states_file(self, engine, checkpoint_dir):
        """A stage the saved pipeline did not have (4 stages reading a 2-stage save) reads
        stage 0's file: counters, scheduler and config are the same in every stage's file."""
        import os

        from deepspeed.checkpoint.collective import model_parallel_rank
        from deepspeed.checkpoint.layout import model_states_filename

        own = os.path.join(checkpoint_dir, model_states_filename(model_parallel_rank(engine)))
        first = os.path.join(checkpoint_dir, model_states_filename(0))
        if not os.path.isfile(own) and os.path.isfile(first):
            return first
        return None  # the core's own choice (and its error naming what exists)

    @hookimpl
    def deepspeed_load_module_state(self, engine, state_dict, strict, checkpoint_dir):
        if engine.config.load_universal_checkpoint:
            return None  # the core reads each parameter by its universal name
        if state_dict is not None and not isinstance(state_dict, str):
            return None  # whole weights (saved by a plain engine): the core loads them
        engine._curr_ckpt_path = checkpoint_dir
        try:
            engine.load_module_state_dict(state_dict, strict=strict)
        finally:
            engine._curr_ckpt_path = None
        return [], []  # load_state_dir applied ``strict`` per layer

    @hookimpl(tryfirst=True)
    def deepspeed_load_optimizer_state(self, engine, checkpoint_dir, state):
        """The optimizer state of a stage holds only its layers: refused across pipeline
        shapes (before any plugin's optimizer files are read); the weights load anyway."""
        saved = state.get(PIPELINE_STAGES_KEY)
        if saved is not None and int(saved) != engine.num_stages:
            raise ValueError(
                f"checkpoint '{checkpoint_dir}' was saved with {int(saved)} pipeline stages and "
                f"this engine has {engine.num_stages}: its optimizer states (per stage) cannot "
                f"be loaded; load with load_optimizer_states=False or load_module_only=True to "
                f"restore the weights only (they are saved per layer and load at any number of "
                f"stages)")
        return None
