"""The DeepSpeed engine: the training step, and the hook points where every feature enters.

The whole step fits on one screen:

    loss = engine(batch)      # deepspeed_before_forward -> module -> deepspeed_after_forward
    engine.backward(loss)     # scale (1/gas, fp16 loss scale) -> autograd -> at the boundary,
                              #   reduce gradients (deepspeed_reduce_gradients, else all-reduce)
    engine.step()             # at the boundary: unscale + overflow check -> clip -> optimizer
                              #   -> copy fp32 masters back -> LR scheduler -> zero grads

Data parallelism over ``deepspeed.comm`` is the core's only strategy (ZeRO stage 0); ZeRO,
pipelining, compressed communication and the rest replace pieces of it through the hooks in
``deepspeed.hooks``. Precision (fp32 / bf16 / fp16) lives in ``deepspeed.precision`` behind one
small protocol, so this file reads the same for all three.
"""
from contextlib import contextmanager

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from deepspeed import comm as dist
from deepspeed import topology
from deepspeed.accelerator import get_accelerator
from deepspeed.gradient_averaging import (communication_dtype, reduce_sparse_gradients,
                                          scale_after_reduce, scale_before_reduce)
from deepspeed.hooks import (GRADIENT_GROUP, NOT_SHARDED, STEP_TIMERS, PrecisionPolicy,
                             check_implements)
from deepspeed.precision import (MixedPrecisionOptimizer, check_precision_supported,
                                 precision_for, training_dtype)
from deepspeed.utils.logging import log_dist, logger
from deepspeed.utils.reports import print_configuration, see_memory_usage
from deepspeed.utils.timer import NoopTimer, SynchronizedWallClockTimer, ThroughputTimer


class DeepSpeedEngine(torch.nn.Module):
    """Wraps the client model; created by ``deepspeed.initialize``."""

    def __init__(self, model, config, plugins, optimizer=None, model_parameters=None,
                 lr_scheduler=None, mpu=None, training_data=None, collate_fn=None):
        super().__init__()
        self.module = model
        self.config = config
        self._config = config  # upstream spelling, read by integrations
        self.plugins = plugins
        self.mpu = mpu
        self.collate_fn = collate_fn
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        # built after deepspeed_engine_init; None until then (members of deepspeed.hooks.Engine)
        self.basic_optimizer = self.optimizer = self.precision = self.lr_scheduler = None
        self.training_dataloader = None
        self.enable_backward_allreduce = True  # upstream's flag; the 1-bit optimizers clear it
        self._boundary_override = None
        self._inside_no_sync = False
        self._global_grad_norm = None
        self._last_loss = None
        self._comm_observer = None
        self._client_model_parameters = (list(model_parameters)
                                         if model_parameters is not None else None)

        self.device = torch.device(get_accelerator().current_device_name())
        self.local_rank = dist.get_local_rank()
        self.global_rank = dist.get_rank()
        # a plugin that splits the model itself (AutoTP training) brings its own groups; the
        # global gradient norm then also sums over its model-parallel group
        unit = self.hook.deepspeed_model_parallel_unit(engine=self, config=config, mpu=mpu)
        if unit is not None:
            self.mpu = mpu = unit
        # every process group of this engine: the dimensions built before it (adopted), "data"
        # and "model" answered by its unit, and those its plugins contribute
        self.topology = topology.for_engine(mpu)
        for contributed in self.hook.deepspeed_parallel_dims(engine=self, config=config):
            self.topology.add(*contributed)
        self._norm_group = (self.topology.group("model") if unit is not None
                            and self.topology.size("model") > 1 else None)
        self.dp_group = self.topology.group("data") if mpu is not None else None  # None: world
        self._previous_topology = (topology.activate(self.topology),)  # restored by destroy()
        try:
            self._set_up(optimizer, lr_scheduler, training_data)
        except BaseException:
            self._detach_process_wide()  # a failed initialize leaves nothing behind
            raise

    def _set_up(self, optimizer, lr_scheduler, training_data):
        config = self.config
        self.dp_world_size = dist.get_world_size(group=self.dp_group)
        check_precision_supported(config, get_accelerator())
        self.module.to(self.device)
        if training_dtype(config) != torch.float32:  # fp32 leaves the user's dtypes alone
            self.module.to(training_dtype(config))
        self.timers = SynchronizedWallClockTimer() if config.wall_clock_breakdown else NoopTimer()
        self.throughput = ThroughputTimer()

        self._subscribe_comm_events()
        self._configure_activation_checkpointing()
        self.hook.deepspeed_engine_init(engine=self, config=config)
        self._attach_plugin_attributes()

        self.basic_optimizer, self.optimizer, self.precision = self._configure_optimizer(optimizer)
        self.lr_scheduler = self._configure_lr_scheduler(lr_scheduler)
        self.training_dataloader = (self.deepspeed_io(training_data, route="train")
                                    if training_data is not None else None)
        self._warn_lossy_accumulation()
        from deepspeed.checkpoint.engines import checkpoint_engine_for

        self.checkpoint_engine = checkpoint_engine_for(self)  # torch / safetensors / async
        config.print("DeepSpeedEngine")
        if config.dump_state:
            print_configuration(self, "DeepSpeedEngine")

    # ------------------------------------------------------------------ plugins
    @property
    def hook(self):
        """The enabled plugins' hooks: ``engine.hook.deepspeed_<name>(...)``."""
        return self.plugins.hook

    def _subscribe_comm_events(self):
        if self.hook.deepspeed_comm_op.get_hookimpls():
            self._comm_observer = _EngineCommObserver(self)
            dist.add_comm_observer(self._comm_observer)

    def _attach_plugin_attributes(self):
        """What plugins expose on the engine for their users (``deepspeed_engine_attributes``)."""
        from deepspeed.plugin_manager import call_each_plugin

        owners = {}
        for plugin, attributes in call_each_plugin(self.hook.deepspeed_engine_attributes,
                                                   engine=self):
            for name, value in (attributes or {}).items():
                if name in owners or _owns_attribute(self, name):
                    raise AttributeError(
                        f"plugin '{plugin}' adds engine attribute '{name}', which "
                        f"{'plugin ' + repr(owners[name]) if name in owners else 'the engine'}"
                        f" already has")
                owners[name] = plugin
                object.__setattr__(self, name, value)

    def __getattr__(self, name):
        """An attribute the engine lacks is the wrapped module's (``engine.generate(...)``, a
        model's own methods and attributes), as upstream forwards it. ``nn.Module`` answers the
        engine's own parameters, buffers and submodules (``self.module``) first, and anything
        the engine defines is found before this is ever called, so nothing is shadowed."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            pass
        module = self.__dict__.get("_modules", {}).get("module")
        if module is not None and not (name.startswith("__") and name.endswith("__")):
            try:
                return getattr(module, name)
            except AttributeError:
                pass
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}', nor "
                             f"does the module it wraps ({type(module).__name__})")

    def destroy(self):
        """Finish a background checkpoint write and detach this engine from process-wide
        services (comm observers, and what plugins attached: ``deepspeed_engine_destroy``)."""
        self.checkpoint_engine.wait()
        if isinstance(self.precision, MixedPrecisionOptimizer):  # its gradient hooks
            self.precision.destroy()
        self.hook.deepspeed_engine_destroy(engine=self)
        self._detach_process_wide()

    def _detach_process_wide(self):
        """Undo what this engine registered process-wide: its comm observer, and its topology
        as the one ``deepspeed.utils.groups`` answers from (if still current)."""
        if self._comm_observer is not None:
            dist.remove_comm_observer(self._comm_observer)
            self._comm_observer = None
        if self._previous_topology is not None:
            if topology.current() is self.topology:
                topology.activate(self._previous_topology[0])
            self._previous_topology = None

    # ------------------------------------------------------------------ set-up
    def _configure_optimizer(self, client_optimizer):
        """(basic optimizer, optimizer to expose, precision policy)."""
        from deepspeed.optimizers import build_optimizer

        basic = build_optimizer(client_optimizer, self.config, self._model_parameters,
                                plugin_builder=lambda **kw: self.hook.deepspeed_build_optimizer(
                                    engine=self, **kw),
                                device=self.hook.deepspeed_optimizer_device(engine=self))
        if basic is not None and self.config.amp_enabled:
            return self._configure_apex_amp(basic)
        wrapped = self.hook.deepspeed_wrap_optimizer(engine=self, optimizer=basic)
        if wrapped is not None:  # the plugin owns precision too (it exposes the same protocol)
            check_implements(wrapped, PrecisionPolicy, "deepspeed_wrap_optimizer")
            return basic, wrapped, wrapped
        precision, exposed = precision_for(self.config, self.module, basic)
        return basic, exposed, precision

    def _configure_apex_amp(self, basic):
        try:
            from apex import amp
        except ImportError as exc:
            raise ImportError("the 'amp' config section needs NVIDIA apex, which is not "
                              "installed; use \"fp16\" or \"bf16\" instead") from exc
        from deepspeed.precision import FullPrecision

        self.module, basic = amp.initialize(self.module, basic, **self.config.amp_params)
        return basic, basic, FullPrecision(self.module, basic)

    def _configure_lr_scheduler(self, client_scheduler):
        if self.optimizer is None:
            return None
        if client_scheduler is not None:
            if callable(client_scheduler) and not hasattr(client_scheduler, "step"):
                return client_scheduler(self.basic_optimizer)
            return client_scheduler
        if self.config.scheduler_name is None:
            return None
        from deepspeed.lr_schedules import build_lr_scheduler

        return build_lr_scheduler(self.config.scheduler_name, self.config.scheduler_params or {},
                                  self.basic_optimizer)

    def _configure_activation_checkpointing(self):
        if self.config.has_section("activation_checkpointing"):
            from deepspeed import checkpointing

            checkpointing.configure(self.mpu, deepspeed_config=self.config)

    def _warn_lossy_accumulation(self):
        if (self.config.bfloat16_enabled and self.gradient_accumulation_steps() > 1
                and self.config.grad_accum_dtype != "fp32"):
            log_dist("bf16 with gradient accumulation accumulates gradients in bf16 (lossy); "
                     "set \"data_types\": {\"grad_accum_dtype\": \"fp32\"} to accumulate in fp32",
                     ranks=[0], level=30)

    @property
    def _model_parameters(self):
        if self._client_model_parameters is not None:
            return self._client_model_parameters
        return [p for p in self.module.parameters() if p.requires_grad]

    def deepspeed_io(self, dataset, batch_size=None, route=None, pin_memory=True,
                     data_sampler=None, collate_fn=None, num_local_io_workers=None):
        """A loader giving each data-parallel rank its own shard of ``dataset``."""
        from torch.utils.data import DataLoader, DistributedSampler

        batch_size = batch_size or self.train_micro_batch_size_per_gpu()
        loader = self.hook.deepspeed_data_loader(
            engine=self, dataset=dataset, batch_size=batch_size, route=route,
            pin_memory=pin_memory, data_sampler=data_sampler,
            collate_fn=collate_fn or self.collate_fn, num_local_io_workers=num_local_io_workers)
        if loader is not None:
            return loader
        rank = dist.get_rank(group=self.dp_group)
        drop_last = self.config.core.dataloader_drop_last
        sampler = data_sampler or DistributedSampler(
            dataset, num_replicas=self.dp_world_size, rank=rank, shuffle=False,
            drop_last=drop_last)
        return DataLoader(dataset, batch_size=batch_size,
                          sampler=sampler, collate_fn=collate_fn or self.collate_fn,
                          num_workers=num_local_io_workers or 0,
                          pin_memory=pin_memory and get_accelerator().device_name() != "cpu",
                          drop_last=drop_last)

    # ------------------------------------------------------------------ the training step
    def forward(self, *args, **kwargs):
        self.timers("forward").start()
        if self.config.fp16_enabled and self.config.fp16_auto_cast:
            args, kwargs = _cast_floats((args, kwargs), torch.float16)
        self.hook.deepspeed_before_forward(engine=self, args=args, kwargs=kwargs)
        replaced = self.hook.deepspeed_forward_inputs(engine=self, args=args, kwargs=kwargs)
        if replaced is not None:
            args, kwargs = replaced
        output = self.module(*args, **kwargs)
        self.hook.deepspeed_after_forward(engine=self, output=output)
        self.timers("forward").stop()
        return output

    def backward(self, loss, allreduce_gradients=True, release_loss=False, retain_graph=False,
                 scale_wrt_gas=True):
        """Accumulate gradients of ``loss``; at the boundary, average them over data parallel
        ranks. Returns the loss divided by gas (what was back-propagated, before loss scaling)."""
        assert self.optimizer is not None, \
            "must provide optimizer during init in order to use backward"
        if not allreduce_gradients:
            logger.warning("backward(allreduce_gradients=False) is deprecated and ignored")
        self.timers("backward").start()
        self.hook.deepspeed_before_backward(engine=self, loss=loss)
        if scale_wrt_gas and self.gradient_accumulation_steps() > 1:
            loss = loss / self.gradient_accumulation_steps()
        self._last_loss = loss.detach()
        self.timers("backward_inner").start()
        self.precision.scale_loss(loss).backward(retain_graph=retain_graph)
        self.precision.accumulate_micro_grads()
        self.timers("backward_inner").stop()
        if self.is_gradient_accumulation_boundary() and not self._inside_no_sync:
            self.timers("backward_allreduce").start()
            if not self.hook.deepspeed_reduce_gradients(engine=self):
                self.allreduce_gradients()
            self.timers("backward_allreduce").stop()
        self.hook.deepspeed_after_backward(engine=self, loss=loss)
        self.timers("backward").stop()
        return loss

    def allreduce_gradients(self):
        """Average gradients over the data-parallel group in one flat buffer (one collective
        instead of one per parameter), in ``communication_data_type`` when set."""
        if self.dp_world_size == 1:
            return
        grads = self.precision.reduction_grads()
        grads = reduce_sparse_gradients(grads, self.config, self.dp_group, self.dp_world_size)
        for group, members in self._by_gradient_group(grads):
            flat = _flatten_dense_tensors(members).to(
                communication_dtype(self.config, members[0].dtype))
            scale_before_reduce(flat, self.config)
            dist.all_reduce(flat, group=group)
            scale_after_reduce(flat, self.config, self.dp_world_size)
            for grad, reduced in zip(members, _unflatten_dense_tensors(flat, members)):
                grad.copy_(reduced)

    def _by_gradient_group(self, grads):
        """``[(group, grads)]``: one flat all-reduce per group; parameters declaring
        ``deepspeed.hooks.GRADIENT_GROUP`` (experts) are summed over their own group."""
        if not grads:
            return []
        if not any(hasattr(p, GRADIENT_GROUP) for p in self.module.parameters()):
            return [(self.dp_group, grads)]
        declared = {}
        for param in self.module.parameters():
            if param.grad is not None:
                declared[id(param.grad)] = getattr(param, GRADIENT_GROUP, self.dp_group)
        for stepped in self.precision.master_params():
            model = self.precision.model_param_of(stepped)
            if stepped.grad is not None and model is not None:
                declared[id(stepped.grad)] = getattr(model, GRADIENT_GROUP, self.dp_group)
        buckets = {}
        for grad in grads:  # the same order on every rank, so the collectives pair up
            group = declared.get(id(grad), self.dp_group)
            buckets.setdefault(id(group), (group, []))[1].append(grad)
        return list(buckets.values())

    def step(self, lr_kwargs=None, lr_kwarg=None):
        """Update the weights at the accumulation boundary; otherwise only count the micro step.
        (``lr_kwarg`` is the spelling in the API reference, ``lr_kwargs`` upstream's.)"""
        assert self.optimizer is not None, \
            "must provide optimizer during init in order to use step"
        if self._inside_no_sync:  # local: every rank raises, before any collective
            raise RuntimeError("engine.step() is illegal inside no_sync(): the gradients of its "
                               "backward passes were not reduced over the data-parallel ranks, "
                               "so the replicas would diverge; run the last micro-batch's "
                               "backward() and then step() after leaving no_sync() (that "
                               "backward reduces the accumulated gradients)")
        lr_kwargs = lr_kwargs if lr_kwargs is not None else lr_kwarg
        see_memory_usage("Engine before step", force=self.config.memory_breakdown)
        self.timers("step").start()
        boundary = self.is_gradient_accumulation_boundary()
        if boundary:
            self.hook.deepspeed_before_step(engine=self)
            finite = self.precision.unscale_grads()  # False: fp16 overflow, skip this step
            if finite:  # the optimizer the precision policy steps is self.basic_optimizer
                self._clip_gradients()
                self.precision.optimizer_step()
                self.precision.after_optimizer_step()
                if self.lr_scheduler is not None:
                    self.lr_scheduler.step(**(lr_kwargs or {}))
            else:
                self.skipped_steps += 1
            self.precision.update_scale(overflow=not finite)
            self.precision.zero_grad()
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
            self.throughput.step(self.train_batch_size())
        self.micro_steps += 1
        self._boundary_override = None
        self.timers("step").stop()
        see_memory_usage("Engine after step", force=self.config.memory_breakdown)
        if boundary:
            self.hook.deepspeed_after_step(engine=self)  # sees this step's timers (monitors)
            self._report_progress()

    def _clip_gradients(self):
        """Clip to ``gradient_clipping`` (0 = off), recording the global norm it measured (over
        all ranks' partitions when gradients are sharded). Without clipping no norm is computed
        (a full pass over the gradients every step), and ``get_global_grad_norm()`` is None."""
        clip = self.config.gradient_clipping
        if clip and clip > 0:
            group = self.gradient_norm_group()
            self._global_grad_norm = (self.precision.clip_grad_norm(clip) if group is None else
                                      self.precision.clip_grad_norm(clip, norm_group=group))

    def gradient_norm_group(self):
        """The ranks holding the model's other parameters, whose gradients the global norm sums
        too: the model-parallel group of a plugin's unit (AutoTP), else None. A template method:
        the pipeline engine answers its pipe group."""
        return self._norm_group

    def _report_progress(self):
        every = self.config.steps_per_print
        if not every or self.global_steps == 0 or self.global_steps % every:
            return
        log_dist(self.progress_report(), ranks=[0])
        # the engine's own phases first, then any a plugin timed (ZeRO's reduce / all-gather)
        self.timers.log(list(STEP_TIMERS) + [name for name in self.timers.names()
                                             if name not in STEP_TIMERS])

    def progress_report(self):
        """The line logged every ``steps_per_print`` steps (a template method an engine subclass
        overrides); samples/sec covers the steps since the previous report."""
        current, average = self.throughput.report()
        loss = None if self._last_loss is None else \
            self._last_loss.item() * self.gradient_accumulation_steps()
        lrs = ", ".join(f"{lr:.4g}" for lr in self.get_lr())
        return (f"step={self.global_steps}, skipped={self.skipped_steps}, lr=[{lrs}], "
                f"loss={'None' if loss is None else f'{loss:.4g}'}, "
                f"samples/sec={current:.2f} (avg {average:.2f})")

    # ------------------------------------------------------------------ queries and switches
    @contextmanager
    def no_sync(self):
        """Skip the gradient reduction inside this context (gradients keep accumulating); the
        first ``backward`` after it reduces them. ``step()`` inside it raises."""
        assert not self.sharding.partitions_gradients, \
            "no_sync is not compatible with ZeRO stage 2 or 3 (gradients are partitioned)"
        assert not self._inside_no_sync, "no_sync contexts cannot be nested"
        self._inside_no_sync = True
        try:
            yield
        finally:
            self._inside_no_sync = False

    def is_gradient_accumulation_boundary(self):
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary):
        """Force the next backward/step to (not) be a boundary, e.g. for variable-length epochs."""
        self._boundary_override = bool(is_boundary)

    def train_batch_size(self):
        return self.config.train_batch_size

    def train_micro_batch_size_per_gpu(self):
        return self.config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self):
        return self.config.gradient_accumulation_steps

    def gradient_clipping(self):
        return self.config.gradient_clipping

    @property
    def sharding(self):
        """How an enabled plugin shards the training state (``deepspeed.hooks.Sharding``)."""
        return self.hook.deepspeed_sharding(engine=self) or NOT_SHARDED

    def zero_optimization_stage(self):
        return self.sharding.stage

    @property
    def monitor(self):
        """The enabled monitor plugin's writer (``write_events``), or None."""
        return self.hook.deepspeed_engine_monitor(engine=self)

    def fp16_enabled(self):
        return self.config.fp16_enabled

    def bfloat16_enabled(self):
        return self.config.bfloat16_enabled

    def get_global_grad_norm(self):
        return self._global_grad_norm

    def get_lr(self):
        if self.optimizer is None:
            return []
        return [group["lr"] for group in self.optimizer.param_groups]

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest=True,
                        exclude_frozen_parameters=False):
        from deepspeed.checkpoint import save_checkpoint

        return save_checkpoint(self, save_dir, tag=tag, client_state=client_state,
                               save_latest=save_latest,
                               exclude_frozen_parameters=exclude_frozen_parameters)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False, custom_load_fn=None):
        from deepspeed.checkpoint import load_checkpoint

        return load_checkpoint(self, load_dir, tag=tag, load_module_strict=load_module_strict,
                               load_optimizer_states=load_optimizer_states,
                               load_lr_scheduler_states=load_lr_scheduler_states,
                               load_module_only=load_module_only, custom_load_fn=custom_load_fn)

    def zero_gather_16bit_weights_on_model_save(self):
        """Whether a 16-bit save gathers ZeRO-3 shards (HF Trainer asks before saving)."""
        return self.sharding.gathers_16bit_weights_on_save

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters=False):
        """The whole module's weights in their training dtype, gathered from shards where a
        plugin holds them; on global rank 0 (None elsewhere). Collective. Upstream's name,
        called by HF Trainer / Accelerate."""
        from deepspeed.checkpoint.model_state import module_state_dict

        built = self.hook.deepspeed_consolidated_16bit_state_dict(
            engine=self, exclude_frozen_parameters=exclude_frozen_parameters)
        if built is not None:
            return built["state_dict"]
        if dist.get_rank() != 0:
            return None
        return module_state_dict(self.module, exclude_frozen_parameters)

    def _consolidated_16bit_state_dict(self, exclude_frozen_parameters=False):
        """Upstream's name for the same consolidated weights when tensor parallelism (AutoTP)
        splits them (Accelerate calls it then). Whatever plugin shards the weights answers the
        ``deepspeed_consolidated_16bit_state_dict`` hook, so one implementation serves both."""
        return self._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters)

    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin",
                         exclude_frozen_parameters=False):
        from deepspeed.checkpoint import save_16bit_model

        return save_16bit_model(self, save_dir, save_filename=save_filename,
                                exclude_frozen_parameters=exclude_frozen_parameters)


class _EngineCommObserver:
    """What ``deepspeed.comm`` sees of an engine: each completed op goes to the plugins'
    ``deepspeed_comm_op``, and ``deepspeed.comm.log_summary()`` to ``deepspeed_comm_summary``."""

    def __init__(self, engine):
        self.hook = engine.hook
        self.engine = engine

    def __call__(self, record):
        self.hook.deepspeed_comm_op(record=record)

    def log_summary(self, show_straggler=False, return_dict=False):
        return self.hook.deepspeed_comm_summary(engine=self.engine, show_straggler=show_straggler,
                                                return_dict=return_dict)


def _owns_attribute(engine, name):
    """Whether ``engine`` itself has ``name``, not counting what ``DeepSpeedEngine.__getattr__``
    forwards to the wrapped module (a model attribute is no clash for a plugin's member)."""
    return (name in vars(engine) or hasattr(type(engine), name)
            or any(name in vars(engine).get(table, ())
                   for table in ("_parameters", "_buffers", "_modules")))


def _cast_floats(value, dtype):
    """``fp16.auto_cast``: floating-point tensors in (nested) inputs become ``dtype``."""
    if torch.is_tensor(value):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_floats(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast_floats(v, dtype) for k, v in value.items()}
    return value
