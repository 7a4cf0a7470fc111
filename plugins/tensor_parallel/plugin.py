"""The ``tensor_parallel`` plugin: AutoTP training.

- ``deepspeed.tp_model_init`` reaches it through ``deepspeed_tp_model_init`` (asked of every
  installed plugin);
- an engine takes part when its config sets ``tensor_parallel.autotp_size`` > 1 (the model is
  split at ``deepspeed.initialize`` if ``tp_model_init`` was not called) or when its model was
  split by ``tp_model_init`` (``deepspeed_enable_for_model``), and then gets the split's
  groups as its model-parallel unit (``deepspeed_model_parallel_unit``): gradients are
  averaged, and ZeRO-1/2 partitions laid out, over the data-parallel group only; the gradient
  norm also sums over the tensor-parallel group; checkpoints are written per tensor-parallel
  rank (``mp_rank_XX``);
- 16-bit saves gather the shards into the unsplit model (``deepspeed_save_16bit_model``,
  ``deepspeed_consolidated_16bit_state_dict``), and the engine says it does
  (``zero_gather_16bit_weights_on_model_save()`` true, which Accelerate asks before saving).
"""
import dataclasses

from deepspeed.hooks import NOT_SHARDED, hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin
from deepspeed.tensor_parallel.config import SECTION, TensorParallelTrainingConfig
from deepspeed.utils.lazy_module import lazy_module

# loaded on first use (the launcher imports this plugin without torch)
shard = lazy_module("deepspeed.tensor_parallel.shard")


class TensorParallelPlugin(DeepSpeedPlugin):
    config_sections = {SECTION: TensorParallelTrainingConfig}
    enabled_by = "tensor_parallel.autotp_size > 1, or a model split by deepspeed.tp_model_init"

    def is_enabled(self, config, sections):
        section = config.section(SECTION)
        return section is not None and section.size > 1

    @hookimpl
    def deepspeed_tp_model_init(self, model, tp_size, dtype, config, kwargs):
        return shard.tp_model_init(model, tp_size, dtype, config, **kwargs)

    @hookimpl
    def deepspeed_enable_for_model(self, model):
        return shard.split_of(model) is not None

    @hookimpl
    def deepspeed_model_parallel_unit(self, engine, config, mpu):
        if engine.zero_optimization_stage() >= 3:  # before ZeRO-3 partitions anything
            raise NotImplementedError(
                "tensor_parallel (AutoTP training) together with ZeRO stage 3 is not supported: "
                "ZeRO-3 would partition the tensor-parallel shards again; use "
                "zero_optimization.stage 0, 1 or 2")
        section = config.section(SECTION)
        wanted = section.size if section is not None else 1
        split = shard.split_of(engine.module)
        if split is None:
            if wanted == 1:
                return None
            from deepspeed.tensor_parallel.groups import init_tensor_parallel_groups

            shard.split_model(engine.module, init_tensor_parallel_groups(wanted),
                              section.injection_policy_tuple,
                              shard_device=shard.shard_device(section, engine.device),
                              overlap_comm=section.tp_overlap_comm)
            split = shard.split_of(engine.module)
        else:
            if wanted > 1 and wanted != split.tp_size:
                raise ValueError(f"config tensor_parallel.autotp_size={wanted}, but the model "
                                 f"was split over {split.tp_size} ranks by "
                                 f"deepspeed.tp_model_init; use the same size in both")
            if section is not None:  # the training config decides, as it does at the split
                shard.set_overlap_comm(engine.module, section.tp_overlap_comm)
        if mpu is not None and mpu is not split.groups:
            raise ValueError(
                "deepspeed.initialize was given its own mpu for a model split by AutoTP "
                "training, which builds its tensor x data parallel groups itself "
                "(deepspeed.tensor_parallel.TensorParallelGroups); drop the mpu argument")
        return split.groups

    @hookimpl(wrapper=True)
    def deepspeed_sharding(self, engine):
        """Whatever shards the optimizer state (ZeRO-1/2), a 16-bit save gathers the
        tensor-parallel shards."""
        answer = yield
        return dataclasses.replace(answer or NOT_SHARDED, gathers_16bit_weights_on_save=True)

    @hookimpl
    def deepspeed_consolidated_16bit_state_dict(self, engine, exclude_frozen_parameters):
        from deepspeed.tensor_parallel.gather import full_state_dict

        return {"state_dict": full_state_dict(engine.module, engine.mpu,
                                              exclude_frozen_parameters)}

    @hookimpl
    def deepspeed_save_16bit_model(self, engine, save_dir, save_filename,
                                   exclude_frozen_parameters):
        from deepspeed.checkpoint.collective import on_all_ranks
        from deepspeed.tensor_parallel.gather import save_full_model

        return on_all_ranks(
            engine, f"saving the gathered 16-bit model to '{save_dir}/{save_filename}'",
            lambda: save_full_model(engine.module, engine.mpu, save_dir, save_filename,
                                    exclude_frozen_parameters))
