"""The ``zero`` plugin: ZeRO's place in the engine, through the hooks in ``deepspeed.hooks``.

Enabled by ``zero_optimization.stage`` > 0. It replaces the engine's optimizer with
``DeepSpeedZeroOptimizer`` (which is also the precision policy), the core all-reduce with its
bucketed reduce-scatter, and the optimizer part of checkpoints with per-rank partition files.
"""
import functools
import gc
import weakref

from pydantic import StrictBool

from deepspeed.accelerator import get_accelerator
from deepspeed.hooks import Sharding, hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin
from deepspeed.utils.logging import logger
from deepspeed.zero.aio_config import AioConfig
from deepspeed.zero.config import DeepSpeedZeroConfig
from deepspeed.zero.offload_config import OffloadDeviceEnum
from deepspeed.utils.lazy_module import lazy_module

torch = lazy_module("torch")  # loaded on first use (the launcher imports this plugin without torch)

CPU_OPTIMIZER_NAMES = ("DeepSpeedCPUAdam", "DeepSpeedCPUAdagrad", "DeepSpeedCPULion")
#: top-level keys of ZeRO's optimizer policy, with their defaults when the config omits them
ALLOW_UNTESTED, FORCE_DS_CPU = "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"
POLICY_DEFAULTS = {ALLOW_UNTESTED: False, FORCE_DS_CPU: True}


def policy(config, key):
    """The value of one of ZeRO's top-level optimizer-policy keys, or its default."""
    value = config.section(key)
    return POLICY_DEFAULTS[key] if value is None else value


def zero_supported_optimizers():
    """The optimizer classes ZeRO is tested with; anything else needs the config's
    ``zero_allow_untested_optimizer: true``."""
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
    from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

    return (torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, FusedAdam, DeepSpeedCPUAdam,
            DeepSpeedCPUAdagrad, FusedLion, DeepSpeedCPULion)


def is_zero_supported_optimizer(optimizer) -> bool:
    return type(optimizer) in zero_supported_optimizers()


def _zero_optimizer(engine):
    from deepspeed.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    optimizer = engine.optimizer
    return optimizer if isinstance(optimizer, DeepSpeedZeroOptimizer) else None


def _stage(config):
    """The validated stage (the section model also reads the legacy boolean form); 0 when the
    config has no ``zero_optimization`` section."""
    if not config.has_section("zero_optimization"):
        return 0
    return int(config.section("zero_optimization").stage)


def _offload_device(zero_config):
    offload = zero_config.offload_optimizer
    if offload is None:
        return OffloadDeviceEnum.none
    return OffloadDeviceEnum(offload.device)


def check_optimizer(config, zero_config, optimizer):
    """The documented refusals, before any state is partitioned."""
    name = type(optimizer).__name__
    _check_offload_optimizer(config, zero_config, name)
    _check_fp16_masters(config, zero_config, optimizer)
    if config.bfloat16_enabled and config.bfloat16_immediate_grad_update \
            and int(zero_config.stage) == 1:
        _warn_immediate_grad_update_stage_1()
    if not is_zero_supported_optimizer(optimizer):
        if not policy(config, ALLOW_UNTESTED):
            raise ValueError(
                f"You are using an untested ZeRO Optimizer ({name}). Please add "
                f"<\"zero_allow_untested_optimizer\": true> in the configuration file to use it.")
        logger.warning(f"**** You are using ZeRO with an untested optimizer ({name}), "
                       f"proceed with caution *****")


def _check_offload_optimizer(config, zero_config, name):
    """First: an optimizer that cannot run offloaded is refused for that reason, not as
    "untested"."""
    if _offload_device(zero_config) is not OffloadDeviceEnum.none:
        if "lamb" in name.lower():
            raise ValueError("zero_optimization.offload_optimizer does not work with LAMB "
                             "(it needs a CPU implementation); use Adam or disable the offload")
        if name not in CPU_OPTIMIZER_NAMES and policy(config, FORCE_DS_CPU):
            raise ValueError(
                f"zero_optimization.offload_optimizer steps the optimizer on the CPU, and {name} "
                f"is not a DeepSpeed CPU optimizer (DeepSpeedCPUAdam/Adagrad/Lion), which would "
                f"be much slower; configure the optimizer in the 'optimizer' section, or set "
                f"\"zero_force_ds_cpu_optimizer\": false to use {name} anyway")


@functools.lru_cache(maxsize=None)  # once per process
def _warn_immediate_grad_update_stage_1():
    """Stages 2 and 3 hand every gradient to its partition from a hook as backward produces
    it, which is what ``bf16.immediate_grad_update`` asks for; stage 1 cannot."""
    logger.warning("bf16.immediate_grad_update has no effect with ZeRO stage 1, which keeps each "
                   "micro-batch's full gradients in param.grad until the accumulation boundary; "
                   "use zero_optimization.stage 2, where every gradient moves into this rank's "
                   "partition as soon as backward produces it")


def _check_fp16_masters(config, zero_config, optimizer):
    """``fp16.fp16_master_weights_and_grads`` (fp16 masters and gradient partitions on the
    host, fp32 optimizer states) is ZeRO-Offload's: stage 2 with the optimizer on the CPU and
    an optimizer that keeps its states in fp32 (DeepSpeedCPUAdam)."""
    if not config.fp16_master_weights_and_grads:
        return
    problems = []
    if not config.fp16_enabled:
        problems.append("fp16.enabled is false")
    if int(zero_config.stage) != 2:
        problems.append(f"zero_optimization.stage is {int(zero_config.stage)}")
    if _offload_device(zero_config) is not OffloadDeviceEnum.cpu:
        problems.append(f"zero_optimization.offload_optimizer.device is "
                        f"{_offload_device(zero_config).value!r}")
    if not getattr(optimizer, "fp32_optimizer_states", False):
        problems.append(f"the optimizer {type(optimizer).__name__} does not keep fp32 states "
                        f"for fp16 weights")
    if problems:
        raise ValueError(
            f"fp16.fp16_master_weights_and_grads: true needs fp16 training with ZeRO stage 2, "
            f"offload_optimizer.device \"cpu\" and DeepSpeedCPUAdam (fp32 optimizer states), "
            f"but {'; '.join(problems)}; change those or remove the key")


def setup_stage3(engine, zero_config, aio_kwargs=None):
    """Partition the engine's model (what ``zero.Init`` did not already), decide which
    parameters persist (they become whole at their first gather), and install the
    gather/release hooks."""
    from deepspeed.zero.mics import check_partitioned_consistently, make_partitioner
    from deepspeed.zero.partition_parameters import (apply_persistence, is_zero_param,
                                                     partition_module)
    from deepspeed.zero.stage3 import ParameterCoordinator

    offload = zero_config.offload_param
    remote = offload.device.value if offload is not None and offload.device.value != "none" \
        else None
    store = None
    if remote == "nvme":
        from deepspeed import comm as dist
        from deepspeed.zero.offload.param_store import NVMeShardStore

        store = NVMeShardStore(offload.nvme_path, dist.get_rank(), aio_kwargs=aio_kwargs,
                               buffer_count=offload.buffer_count, buffer_size=offload.buffer_size,
                               max_in_cpu=offload.max_in_cpu, pin_memory=bool(offload.pin_memory))
    partitioner = make_partitioner(engine.dp_group, zero_config, remote_device=remote,
                                   pin_memory=bool(offload.pin_memory) if offload else False,
                                   shard_store=store)
    check_partitioned_consistently(engine.module.parameters(), partitioner)
    partition_module(engine.module, partitioner)
    for param in engine.module.parameters():
        if not is_zero_param(param):
            continue
        # the engine may have cast or moved the placeholders after zero.Init built them
        target = torch.device("cpu") if remote else param.data.device
        shard = param.ds_partitioner.fetch(param)
        if shard.dtype != param.dtype or shard.device != target:
            param.ds_tensor = shard.to(device=target, dtype=param.dtype)
        param.ds_partitioner.settle(param)
    apply_persistence([p for p in engine.module.parameters() if is_zero_param(p)],
                      zero_config.param_persistence_threshold,
                      zero_config.model_persistence_threshold)
    return ParameterCoordinator(engine.module, zero_config.prefetch_bucket_size,
                                zero_config.max_live_parameters,
                                zero_config.max_reuse_distance,
                                zero_config.memory_efficient_linear).install()


def _setup_zeropp(engine, zero_config, coordinator):
    from deepspeed.zero.zeropp.setup import setup_zeropp

    return setup_zeropp(engine, zero_config, coordinator._partitioners, coordinator._zero_params)


def _nvme_swapper_factory(engine, zero_config, aio_config):
    from deepspeed.zero.offload.nvme import OptimizerStateSwapper, validate_nvme_path

    offload = zero_config.offload_optimizer
    path = validate_nvme_path(offload.nvme_path, "zero_optimization.offload_optimizer.nvme_path")
    from deepspeed import comm as dist

    rank = dist.get_rank()

    def build(optimizer):
        return OptimizerStateSwapper(optimizer, path, rank, aio_kwargs=aio_config.handle_kwargs(),
                                     pin_memory=bool(offload.pin_memory),
                                     buffer_count=int(offload.buffer_count),
                                     read_ahead=offload.pipeline_read,
                                     write_behind=offload.pipeline_write)

    return build


def _zenflow_optimizer(zenflow):
    """ZenFlow's optimizer (``deepspeed.zero.zenflow``), called like ``DeepSpeedZeroOptimizer``."""
    from functools import partial

    from deepspeed.zero.zenflow.optimizer import ZenFlowZeroOptimizer

    return partial(ZenFlowZeroOptimizer, zenflow=zenflow)


class ZeroPlugin(DeepSpeedPlugin):
    # the two policy keys are plain booleans at the top level of the config, as upstream has them
    config_sections = {"zero_optimization": DeepSpeedZeroConfig, "aio": AioConfig,
                       ALLOW_UNTESTED: StrictBool, FORCE_DS_CPU: StrictBool}
    enabled_by = "zero_optimization.stage > 0"
    tested_by = {
        ALLOW_UNTESTED: "tests/plugins/zero/test_zero_partitioning.py::test_documented_refusals",
        FORCE_DS_CPU: "tests/plugins/zero/test_zero_partitioning.py::test_documented_refusals",
    }

    def is_enabled(self, config, sections):
        return _stage(config) > 0

    def _zero_config(self, config):
        return config.section("zero_optimization")

    def _aio_config(self, config):
        top = config.section("aio")
        nested = getattr(self._zero_config(config), "aio", None)
        return top or nested or AioConfig()

    @hookimpl
    def deepspeed_engine_init(self, engine, config):
        if config.amp_enabled:
            raise ValueError("Amp and ZeRO are not currently compatible: remove the 'amp' "
                             "section (use \"fp16\" or \"bf16\") or set zero_optimization.stage 0")
        self.coordinator = None
        self.shard_comm = None  # ZeRO++ (shard_comm seam), set up with the ZeRO-3 partitions
        from deepspeed.zero.mics import check_mics_config

        check_mics_config(self._zero_config(config))
        from deepspeed.zero.zeropp.setup import check_zeropp

        check_zeropp(self._zero_config(config), engine.dp_world_size)
        if _stage(config) >= 3:
            self.coordinator = setup_stage3(engine, self._zero_config(config),
                                            self._aio_config(config).handle_kwargs())
            # an engine dropped without destroy() must not leave its patches behind either
            weakref.finalize(engine, self.coordinator.remove)
            self.shard_comm = _setup_zeropp(engine, self._zero_config(config), self.coordinator)

    @hookimpl
    def deepspeed_engine_attributes(self, engine):
        """Upstream's ZeRO members of the engine. They reach the engine through a weak
        reference: a closure over it, stored on it, would be a cycle, and an engine dropped
        without ``destroy()`` would then keep its hooks and patches until the next garbage
        collection instead of leaving when its last reference goes."""
        engine_ref = weakref.ref(engine)
        return {"empty_partition_cache": lambda: self.empty_partition_cache(engine_ref())}

    def empty_partition_cache(self, engine):
        """``engine.empty_partition_cache()``: release the parameters ZeRO-3 keeps whole
        between steps (the persistent ones, and any still gathered), so that after training
        their memory is free; training may go on, they are gathered again when used. Stages 1
        and 2 keep whole parameters by design and cache nothing: a no-op there."""
        if self.coordinator is None:
            return
        optimizer = _zero_optimizer(engine)
        if optimizer is not None:
            optimizer.forget_resident()
        self.coordinator.empty_partition_cache()
        gc.collect()  # the full buffers die with their last reference; return them now
        get_accelerator().empty_cache()

    @hookimpl
    def deepspeed_sharding(self, engine):
        zero_config = self._zero_config(engine.config)
        return Sharding(stage=int(zero_config.stage),
                        gathers_16bit_weights_on_save=bool(
                            zero_config.gather_16bit_weights_on_model_save))

    @hookimpl
    def deepspeed_optimizer_device(self, engine):
        """ZeRO-Offload steps the optimizer on the host (NVMe swaps host buffers too), so the
        core builds DeepSpeed's CPU optimizer for it."""
        if _offload_device(self._zero_config(engine.config)) is OffloadDeviceEnum.none:
            return None
        return "cpu"

    @hookimpl
    def deepspeed_engine_destroy(self, engine):
        optimizer = _zero_optimizer(engine)
        if optimizer is not None:
            optimizer.destroy()  # gradient hooks, NVMe swap files
        if self.coordinator is not None:
            self.coordinator.remove()  # module hooks, the process-wide attribute watch

    @hookimpl
    def deepspeed_after_forward(self, engine):
        if self.coordinator is not None:
            self.coordinator.end_of_forward()

    @hookimpl
    def deepspeed_after_backward(self, engine):
        if self.coordinator is not None:
            self.coordinator.end_of_backward()

    @hookimpl
    def deepspeed_wrap_optimizer(self, engine, optimizer):
        if optimizer is None:
            return None
        from deepspeed.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

        config = engine.config
        zero_config = self._zero_config(config)
        if zero_config.zenflow is not None:  # a ZeRO optimizer built the same way, plus ZenFlow
            DeepSpeedZeroOptimizer = _zenflow_optimizer(zero_config.zenflow)  # noqa: N806
        check_optimizer(config, zero_config, optimizer)
        device = _offload_device(zero_config)
        swapper = (_nvme_swapper_factory(engine, zero_config, self._aio_config(config))
                   if device is OffloadDeviceEnum.nvme else None)
        wrapped = DeepSpeedZeroOptimizer(
            optimizer, config=config, zero_config=zero_config, module=engine.module,
            dp_group=engine.dp_group, nvme_swapper=swapper, timers=engine.timers,
            offload_device="cpu" if device is not OffloadDeviceEnum.none else None)
        if getattr(self, "shard_comm", None) is not None:
            from deepspeed.zero.zeropp.setup import attach_to_optimizer

            attach_to_optimizer(wrapped, self.shard_comm, engine.module)
        return wrapped

    @hookimpl
    def deepspeed_after_step(self, engine):
        if getattr(self, "shard_comm", None) is not None:
            self.shard_comm.after_step()

    @hookimpl
    def deepspeed_reduce_gradients(self, engine):
        optimizer = _zero_optimizer(engine)
        if optimizer is None:
            return None
        optimizer.reduce_gradients()
        return True

    # ------------------------------------------------------------------ checkpoints
    @hookimpl
    def deepspeed_save_optimizer_state(self, engine, checkpoint_dir, tag):
        from deepspeed.checkpoint.collective import data_parallel_rank, model_parallel_rank
        from deepspeed.zero.checkpointing import save_rank_file

        optimizer = _zero_optimizer(engine)
        if optimizer is None:
            return None
        if hasattr(optimizer, "flush"):  # ZenFlow: land a background CPU step before saving
            optimizer.flush()
        save_rank_file(optimizer, checkpoint_dir, data_parallel_rank(engine),
                       model_parallel_rank(engine), engine.config.to_dict())
        return True

    @hookimpl
    def deepspeed_save_checkpoint(self, engine, save_dir, state):
        optimizer = _zero_optimizer(engine)
        if optimizer is None:
            return
        from collections import OrderedDict

        from deepspeed.zero.checkpointing import copy_zero_to_fp32

        # inside the save's all-ranks phase: a failed copy on any rank fails the save before
        # 'latest' moves
        copy_zero_to_fp32(engine, save_dir)
        names = optimizer.param_names
        state["zero_partition_count"] = optimizer.partition_count  # MiCS: < dp_world_size
        state["frozen_param_shapes"] = OrderedDict(
            (n, torch.Size(getattr(p, "ds_shape", p.shape)))
            for n, p in engine.module.named_parameters() if not p.requires_grad)
        state["param_shapes"] = [OrderedDict((names[id(p)], torch.Size(getattr(p, "ds_shape",
                                                                                p.shape)))
                                             for p in params)
                                 for params in optimizer.partitioned_params]

    @hookimpl
    def deepspeed_save_16bit_model(self, engine, save_dir, save_filename,
                                   exclude_frozen_parameters):
        if self.coordinator is None:
            return None  # stages 1/2: every rank holds the whole model, the core saves it
        from deepspeed.zero.stage3 import save_16bit_state_dict

        if not self._zero_config(engine.config).gather_16bit_weights_on_model_save:
            logger.warning("save_16bit_model: nothing saved, because ZeRO-3 holds only weight "
                           "shards; set zero_optimization.stage3_gather_16bit_weights_on_model_"
                           "save: true to gather them, or use the checkpoint with zero_to_fp32")
            return False
        return save_16bit_state_dict(engine, save_dir, save_filename, exclude_frozen_parameters)

    @hookimpl
    def deepspeed_consolidated_16bit_state_dict(self, engine, exclude_frozen_parameters):
        if self.coordinator is None:
            return None
        from deepspeed.zero.stage3 import gather_16bit_state_dict

        return {"state_dict": gather_16bit_state_dict(engine.module, exclude_frozen_parameters)}

    @hookimpl
    def deepspeed_load_module_state(self, engine, state_dict, strict):
        if self.coordinator is None:
            return None
        from deepspeed.zero.stage3 import load_full_state_dict

        if engine.config.load_universal_checkpoint and state_dict is not None:
            from deepspeed.checkpoint.universal import module_pieces

            # whole tensors: this rank's tensor-parallel pieces of the split parameters
            state_dict = module_pieces(engine.module, state_dict)
        return load_full_state_dict(engine.module, state_dict)

    @hookimpl
    def deepspeed_load_optimizer_state(self, engine, checkpoint_dir, tag, state):
        from deepspeed.checkpoint.collective import data_parallel_rank, model_parallel_rank
        from deepspeed.zero.checkpointing import load_rank_file

        optimizer = _zero_optimizer(engine)
        if optimizer is None:
            return None
        if hasattr(optimizer, "flush"):  # ZenFlow: no background step may write meanwhile
            optimizer.flush()
        load_rank_file(optimizer, checkpoint_dir, data_parallel_rank(engine),
                       model_parallel_rank(engine),
                       elastic=bool(self._zero_config(engine.config).elastic_checkpoint),
                       saved_world=state.get("dp_world_size"),
                       saved_partitions=state.get("zero_partition_count"))
        if hasattr(optimizer, "state_loaded"):
            optimizer.state_loaded()
        return True
