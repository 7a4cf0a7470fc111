"""The DeepSpeed engine: the training step, and the hook points where every feature enters.

The whole step fits on one screen:

    loss = engine(batch)      # deepspeed_before_forward -> module -> deepspeed_after_forward
    engine.backward(loss)     # scale by 1/gas -> autograd -> at the boundary, reduce gradients
                              #   (deepspeed_reduce_gradients, else the core all-reduce average)
    engine.step()             # at the boundary: clip -> optimizer -> LR scheduler -> zero grads

Data parallelism over ``deepspeed.comm`` is the core's only strategy (ZeRO stage 0); ZeRO,
pipelining, compressed communication and the rest replace pieces of it through the hooks in
``deepspeed.hooks``, never by editing this file.
"""
import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.utils.logging import log_dist, logger


class DeepSpeedEngine(torch.nn.Module):
    """Wraps the client model; created by ``deepspeed.initialize``."""

    def __init__(self, model, config, plugins, optimizer=None, model_parameters=None,
                 lr_scheduler=None, mpu=None, training_data=None, collate_fn=None):
        super().__init__()
        self.module = model
        self._client_model_parameters = (list(model_parameters)
                                         if model_parameters is not None else None)
        self.config = config
        self._config = config  # upstream spelling, read by integrations
        self.plugins = plugins
        self.mpu = mpu
        self.collate_fn = collate_fn
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self._boundary_override = None
        self._global_grad_norm = None
        self._comm_observer = None

        self.device = torch.device(get_accelerator().current_device_name())
        self.local_rank = dist.get_local_rank()
        self.module.to(self.device)
        self.dp_group = mpu.get_data_parallel_group() if mpu is not None else None
        self.dp_world_size = dist.get_world_size(group=self.dp_group)

        self._subscribe_comm_events()
        self.hook.deepspeed_engine_init(engine=self, config=config)

        self.optimizer = self._configure_optimizer(optimizer)
        self.lr_scheduler = self._configure_lr_scheduler(lr_scheduler)
        self.training_dataloader = (self.deepspeed_io(training_data)
                                    if training_data is not None else None)
        config.print("DeepSpeedEngine")

    # ------------------------------------------------------------------ plugins
    @property
    def hook(self):
        """The enabled plugins' hooks: ``engine.hook.deepspeed_<name>(...)``."""
        return self.plugins.hook

    def _subscribe_comm_events(self):
        if self.hook.deepspeed_comm_op.get_hookimpls():
            self._comm_observer = lambda record: self.hook.deepspeed_comm_op(record=record)
            dist.add_comm_observer(self._comm_observer)

    def destroy(self):
        """Detach this engine from process-wide services (comm observers)."""
        if self._comm_observer is not None:
            dist.remove_comm_observer(self._comm_observer)
            self._comm_observer = None

    # ------------------------------------------------------------------ set-up
    def _configure_optimizer(self, client_optimizer):
        from deepspeed.optimizers import build_optimizer

        basic = build_optimizer(client_optimizer, self.config, self._model_parameters,
                                plugin_builder=lambda **kw: self.hook.deepspeed_build_optimizer(
                                    engine=self, **kw))
        wrapped = self.hook.deepspeed_wrap_optimizer(engine=self, optimizer=basic)
        return wrapped if wrapped is not None else basic

    def _configure_lr_scheduler(self, client_scheduler):
        if client_scheduler is None or self.optimizer is None:
            return client_scheduler
        if callable(client_scheduler) and not hasattr(client_scheduler, "step"):
            return client_scheduler(self.optimizer)
        return client_scheduler

    @property
    def _model_parameters(self):
        if self._client_model_parameters is not None:
            return self._client_model_parameters
        return [p for p in self.module.parameters() if p.requires_grad]

    def deepspeed_io(self, dataset, batch_size=None, route=None, pin_memory=True,
                     data_sampler=None, collate_fn=None, num_local_io_workers=None):
        """A loader giving each data-parallel rank its own shard of ``dataset``."""
        from torch.utils.data import DataLoader, DistributedSampler

        rank = dist.get_rank(group=self.dp_group)
        sampler = data_sampler or DistributedSampler(
            dataset, num_replicas=self.dp_world_size, rank=rank, shuffle=False,
            drop_last=self.config.core.dataloader_drop_last)
        return DataLoader(dataset, batch_size=batch_size or self.train_micro_batch_size_per_gpu(),
                          sampler=sampler, collate_fn=collate_fn or self.collate_fn,
                          num_workers=num_local_io_workers or 0,
                          pin_memory=pin_memory and get_accelerator().device_name() != "cpu",
                          drop_last=self.config.core.dataloader_drop_last)

    # ------------------------------------------------------------------ the training step
    def forward(self, *args, **kwargs):
        self.hook.deepspeed_before_forward(engine=self, args=args, kwargs=kwargs)
        output = self.module(*args, **kwargs)
        self.hook.deepspeed_after_forward(engine=self, output=output)
        return output

    def backward(self, loss, allreduce_gradients=True, release_loss=False, retain_graph=False,
                 scale_wrt_gas=True):
        """Accumulate gradients of ``loss``; at the boundary, average them over data parallel
        ranks. Returns the loss actually back-propagated (divided by gas when accumulating)."""
        assert self.optimizer is not None, \
            "must provide optimizer during init in order to use backward"
        if not allreduce_gradients:
            logger.warning("backward(allreduce_gradients=False) is deprecated and ignored")
        self.hook.deepspeed_before_backward(engine=self, loss=loss)
        if scale_wrt_gas and self.gradient_accumulation_steps() > 1:
            loss = loss / self.gradient_accumulation_steps()
        loss.backward(retain_graph=retain_graph)
        if self.is_gradient_accumulation_boundary():
            if not self.hook.deepspeed_reduce_gradients(engine=self):
                self.allreduce_gradients()
        self.hook.deepspeed_after_backward(engine=self, loss=loss)
        return loss

    def allreduce_gradients(self):
        """Average gradients over the data-parallel group in one flat buffer (one collective
        instead of one per parameter)."""
        if self.dp_world_size == 1:
            return
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return
        flat = _flatten_dense_tensors(grads)
        flat.div_(self.dp_world_size)
        dist.all_reduce(flat, group=self.dp_group)
        for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(reduced)

    def step(self, lr_kwargs=None, lr_kwarg=None):
        """Update the weights at the accumulation boundary; otherwise only count the micro step.
        (``lr_kwarg`` is the spelling in the API reference, ``lr_kwargs`` upstream's.)"""
        assert self.optimizer is not None, \
            "must provide optimizer during init in order to use step"
        lr_kwargs = lr_kwargs if lr_kwargs is not None else lr_kwarg
        if self.is_gradient_accumulation_boundary():
            self.hook.deepspeed_before_step(engine=self)
            self._clip_gradients()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.lr_scheduler is not None:
                self.lr_scheduler.step(**(lr_kwargs or {}))
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
            self.hook.deepspeed_after_step(engine=self)
            self._report_progress()
        self.micro_steps += 1
        self._boundary_override = None

    def _clip_gradients(self):
        clip = self.config.gradient_clipping
        params = [p for p in self.module.parameters() if p.grad is not None]
        if clip and clip > 0:
            self._global_grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        else:
            self._global_grad_norm = float(torch.nn.utils.get_total_norm(
                [p.grad for p in params])) if params else 0.0

    def _report_progress(self):
        every = self.config.steps_per_print
        if every and self.global_steps % every == 0:
            log_dist(f"step={self.global_steps}, skipped={self.skipped_steps}, "
                     f"lr={self.get_lr()}", ranks=[0])

    # ------------------------------------------------------------------ queries
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

    def zero_optimization_stage(self):
        return self.config.zero_optimization_stage

    def get_global_grad_norm(self):
        return self._global_grad_norm

    def get_lr(self):
        if self.optimizer is None:
            return []
        return [group["lr"] for group in self.optimizer.param_groups]
