"""``PipelineEngine``: the engine ``deepspeed.initialize`` returns for a ``PipelineModule``.

One ``train_batch()`` runs ``gradient_accumulation_steps`` micro-batches through this rank's
stage following ``TrainSchedule`` (synchronous 1F1B): each step of the schedule is a short list
of instructions, each executed by its ``_exec_*`` method (``_INSTRUCTION_MAP``). Activations
and their gradients move between adjacent stages through ``p2p.StageLink``; gradients are
reduced over the stage's data-parallel group by the core (or ZeRO-1 through its hook), tied
weights over the stages sharing them, and the optimizer steps through ``DeepSpeedEngine.step``
at the end. So the precision policies, LR schedules, ZeRO-1, monitors and checkpoints of the
base engine work unchanged; only ``forward`` / ``backward`` / ``step`` are closed to the user
(``PipelineError``), as upstream.

The returned loss is the mean of the batch's micro-batch losses, averaged over the data-parallel
replicas and broadcast from the last stage to every stage of the pipeline.
"""
import os
import time

import torch

from deepspeed import comm as dist
from deepspeed.engine import DeepSpeedEngine
from deepspeed.pipe import schedule
from deepspeed.pipe.config import PipelineConfig
from deepspeed.pipe.p2p import PipelineError, StageLink, TensorSplit
from deepspeed.utils.repeating_loader import RepeatingLoader

TRAIN_LOSS = "Train/Samples/train_loss"
EVAL_LOSS = "Train/Samples/eval_loss"
ONLY_TRAIN_BATCH = "Only train_batch() is accessible in pipeline mode."


def check_pipeline_compatible(engine):
    """The documented refusal (upstream's text), before anything is partitioned."""
    assert engine.sharding.stage < 2, \
        "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"


class PipelineEngine(DeepSpeedEngine):
    """A training engine for hybrid pipeline and data parallelism (upstream's signature:
    ``PipelineEngine(has_bool_tensors=False, *super_args, **super_kwargs)``; tensors of any
    dtype, bool included, cross stages here, so the flag changes nothing)."""

    micro_batches = None  # counted after the base engine's __init__, which asks for gas already

    def __init__(self, *super_args, has_bool_tensors=False, **super_kwargs):
        super().__init__(*super_args, **super_kwargs)
        check_pipeline_compatible(self)
        self.grid = self.module.mpu()
        self.stage_id = self.grid.get_stage_id()
        self.num_stages = self.grid.get_pipe_parallel_world_size()
        self.micro_batch_size = self.train_micro_batch_size_per_gpu()
        self.micro_batches = self.config.gradient_accumulation_steps
        prev_rank = self.grid.stage_to_global(self.stage_id - 1) if self.stage_id > 0 else None
        next_rank = (self.grid.stage_to_global(self.stage_id + 1)
                     if self.stage_id < self.num_stages - 1 else None)
        splits = self._tensor_splits()
        self.link = StageLink(prev_rank, next_rank, device=self.device, **splits)
        # eval_batch's outputs carry no gradient, so its transfers describe themselves apart:
        # sharing one description, an eval after a train_batch looked like a changed shape
        self.eval_link = StageLink(prev_rank, next_rank, device=self.device, **splits)
        self.last_stage_rank = self.grid.stage_to_global(self.num_stages - 1)
        self.pipe_group = self.grid.get_pipe_parallel_group()
        self.data_iterator = None
        self.batch_fn = None
        self._boundary = False
        self.agg_train_loss = None
        self.agg_eval_loss = None
        self._batch_started = None
        if self.training_dataloader is not None:
            self.set_dataiterator(iter(RepeatingLoader(self.training_dataloader)))

    def _tensor_splits(self):
        """The config's ``pipeline.pipe_partitioned`` / ``grad_partitioned``: with tensor
        parallelism in a stage, activations / their gradients cross stage boundaries split over
        the stage's tensor-parallel ranks (without it there is nothing to split over)."""
        size = self.grid.get_slice_parallel_world_size()
        if size == 1:
            return {}
        split = TensorSplit(self.grid.get_slice_parallel_group(), size,
                            self.grid.get_slice_parallel_rank())
        section = self.config.section("pipeline") or PipelineConfig()
        return {"activations": split if section.pipe_partitioned else None,
                "grads": split if section.grad_partitioned else None}

    # ------------------------------------------------------------------ closed to the user
    def forward(self, *args, **kwargs):
        raise PipelineError(ONLY_TRAIN_BATCH)

    def backward(self, *args, **kwargs):
        raise PipelineError(ONLY_TRAIN_BATCH)

    def step(self, *args, **kwargs):
        raise PipelineError(ONLY_TRAIN_BATCH)

    # ------------------------------------------------------------------ queries and setters
    def is_first_stage(self):
        return self.stage_id == 0

    def is_last_stage(self):
        return self.stage_id == self.num_stages - 1

    def is_gradient_accumulation_boundary(self):
        """True only while a ReduceGrads or OptimizerStep instruction runs: the schedule, not
        a micro-step count, decides when gradients are reduced and the optimizer steps."""
        return self._boundary

    def gradient_accumulation_steps(self):
        return self.micro_batches or self.config.gradient_accumulation_steps

    def train_batch_size(self):
        return (self.train_micro_batch_size_per_gpu() * self.gradient_accumulation_steps()
                * self.dp_world_size)

    def set_train_batch_size(self, train_batch_size):
        """Change the global batch by changing the number of micro-batches."""
        per_micro = self.micro_batch_size * self.dp_world_size
        if train_batch_size % per_micro != 0:
            raise ValueError(f"Train batch size must be divisible by micro-batch data "
                             f"parallelism: {train_batch_size} is not a multiple of micro batch "
                             f"{self.micro_batch_size} x data parallel {self.dp_world_size}")
        self.micro_batches = train_batch_size // per_micro

    def set_dataiterator(self, iterator):
        """Only the first stage (inputs) and the last (labels) read data."""
        if self.is_first_stage() or self.is_last_stage():
            self.data_iterator = iterator

    def set_batch_fn(self, fn):
        """``fn(batch)`` post-processes every loaded batch."""
        self.batch_fn = fn

    def reset_activation_shape(self):
        """Call on every rank when activation shapes change (e.g. a new sequence length)."""
        self.link.reset()
        self.eval_link.reset()

    # ------------------------------------------------------------------ train / eval
    def train_batch(self, data_iter=None):
        """Train on one global batch; returns the mean loss (same tensor on every rank)."""
        if not torch.is_grad_enabled():
            raise RuntimeError("train_batch() requires gradients enabled. Use eval_batch() "
                               "instead.")
        if data_iter is not None:
            self.set_dataiterator(data_iter)
        self.module.train()
        self._batch_started = time.time()
        self._start_batch(training=True)
        self._fetch_batch(self.micro_batches)
        steps = schedule.TrainSchedule(micro_batches=self.micro_batches,
                                       stages=self.num_stages, stage_id=self.stage_id)
        self._run(steps)
        return self.agg_train_loss

    def eval_batch(self, data_iter, return_logits=False, compute_loss=True, reduce_output="avg",
                   bcast_loss=True, num_micro_batches=None):
        """Evaluate one global batch without gradients; returns the mean loss (and, with
        ``return_logits``, the last stage's outputs)."""
        if reduce_output not in ("avg", None):
            raise NotImplementedError(f"reduce_output={reduce_output!r}: only 'avg' or None")
        dist.barrier()
        saved_iterator, was_training = self.data_iterator, self.module.training
        self.set_dataiterator(data_iter)
        self.module.eval()
        self._start_batch(training=False, compute_loss=compute_loss)
        steps = schedule.InferenceSchedule(micro_batches=self.micro_batches,
                                           stages=self.num_stages, stage_id=self.stage_id)
        try:
            self._fetch_batch(self.micro_batches)
            with torch.no_grad():
                self._run(steps)
        finally:
            self.data_iterator = saved_iterator
            self.module.train(was_training)
        loss = self._eval_result(reduce_output, bcast_loss,
                                 num_micro_batches or self.micro_batches)
        self.agg_eval_loss = loss
        monitor = self.monitor
        if (monitor is not None and torch.is_tensor(loss) and loss.numel() == 1
                and dist.get_rank() == 0):
            monitor.write_events([(EVAL_LOSS, float(loss), self.global_samples)])
        if return_logits:
            return loss, (self._outputs_kept if self.is_last_stage() else None)
        return loss

    # ------------------------------------------------------------------ the schedule's steps
    def _start_batch(self, training, compute_loss=True):
        count = self.micro_batches if training else 2
        self.inputs, self.labels = [None] * count, [None] * count
        self.outputs, self.grads = [None] * count, [None] * count
        self.losses = []
        self._outputs_kept = []
        self._training, self._compute_loss = training, compute_loss
        self._loaded = 0

    def _run(self, steps):
        for step in steps:
            for instruction in step:
                self._INSTRUCTION_MAP[type(instruction)](self, instruction)

    def _fetch_batch(self, count):
        """Read this batch's ``count`` micro-batches before any stage communicates, and agree
        over the pipeline on whether they were there: a stage that runs out of data must not
        leave the others blocked in a send. StopIteration at the first micro-batch (the data
        ended between batches, as upstream), a PipelineError naming the counts mid-batch."""
        self._batch_data, got = [], count
        if self.is_first_stage() or self.is_last_stage():
            if self.data_iterator is None:
                raise PipelineError("no data: pass data_iter to train_batch/eval_batch, "
                                    "training_data to deepspeed.initialize, or call "
                                    "set_dataiterator()")
            for index in range(count):
                try:
                    batch = next(self.data_iterator)
                except StopIteration:
                    got = index
                    break
                self._batch_data.append(self.batch_fn(batch) if self.batch_fn else batch)
        status = torch.tensor([0 if got == count else (1 if got == 0 else 2)])
        if self.num_stages > 1:
            dist.all_reduce(status, op=dist.ReduceOp.MAX, group=self.pipe_group)
        if status.item() == 1:
            raise StopIteration
        if status.item() == 2:
            where = (f"the data iterator ran out after {got} of {count} micro-batches"
                     if got < count else "another stage's data iterator ran out")
            raise PipelineError(f"{where} of this batch (a batch reads gradient_accumulation_steps"
                                f" = {count} micro-batches)")

    def _exec_load_micro_batch(self, instruction):
        batch = self._batch_data[self._loaded]
        self._loaded += 1
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise PipelineError(f"a pipeline batch must be (inputs, labels), got "
                                f"{type(batch).__name__}"
                                f"{f' of length {len(batch)}' if hasattr(batch, '__len__') else ''}")
        slot = instruction.buffer_id
        if self.is_first_stage():
            self.inputs[slot] = _to(batch[0], self.device, self._input_dtype())
        if self.is_last_stage():
            self.labels[slot] = _to(batch[1], self.device)

    def _input_dtype(self):
        """Floating inputs enter the first stage in the training dtype (bf16 / fp16)."""
        first = next(self.module.parameters(), None)
        return first.dtype if first is not None else None

    def _exec_forward_pass(self, instruction):
        slot = instruction.buffer_id
        self.hook.deepspeed_before_forward(engine=self, args=(self.inputs[slot],), kwargs={})
        outputs = self.module(self.inputs[slot])
        self.hook.deepspeed_after_forward(engine=self, output=outputs)
        if not self.is_last_stage():
            self.outputs[slot] = outputs
            return
        if not self._training:
            self._outputs_kept.append(outputs)
        loss_fn = self.module.loss_fn
        if self._compute_loss and loss_fn is not None:
            loss = loss_fn(outputs, self.labels[slot])
        else:
            loss = outputs
        self.outputs[slot] = loss
        self.losses.append(loss.detach() if torch.is_tensor(loss) else loss)

    def _exec_backward_pass(self, instruction):
        slot = instruction.buffer_id
        if self.is_last_stage():
            loss = self.outputs[slot]
            if self.micro_batches > 1:
                loss = loss / self.micro_batches
            self.precision.scale_loss(loss).backward()
        else:
            outputs = self.outputs[slot]
            tensors = [t for t in ((outputs,) if torch.is_tensor(outputs) else outputs)
                       if t.requires_grad and t.is_floating_point()]
            torch.autograd.backward(tensors=tensors, grad_tensors=self.grads[slot])
        self.precision.accumulate_micro_grads()
        self.outputs[slot], self.grads[slot] = None, None

    def _exec_send_activation(self, instruction):
        (self.link if self._training else self.eval_link).send_activations(
            self.outputs[instruction.buffer_id])
        if not self._training:
            self.outputs[instruction.buffer_id] = None

    def _exec_recv_activation(self, instruction):
        link = self.link if self._training else self.eval_link
        self.inputs[instruction.buffer_id] = link.recv_activations()

    def _exec_send_grad(self, instruction):
        self.link.send_grads(self.inputs[instruction.buffer_id])
        self.inputs[instruction.buffer_id] = None

    def _exec_recv_grad(self, instruction):
        slot = instruction.buffer_id
        self.grads[slot] = self.link.recv_grads(self.outputs[slot])

    def _exec_reduce_tied_grads(self, instruction):
        self.module.allreduce_tied_weight_gradients()

    def _exec_reduce_grads(self, instruction):
        self.agg_train_loss = self._aggregate_loss(self.losses, self.micro_batches)
        self._boundary = True
        try:
            if not self.hook.deepspeed_reduce_gradients(engine=self):
                self.allreduce_gradients()
        finally:
            self._boundary = False

    def _exec_optimizer_step(self, instruction):
        # monitors read the batch loss from after_backward, as for the base engine
        self.hook.deepspeed_after_backward(engine=self, loss=self.agg_train_loss)
        self._boundary = True
        try:
            DeepSpeedEngine.step(self)
        finally:
            self._boundary = False

    # ------------------------------------------------------------------ losses
    def _aggregate_loss(self, losses, count):
        """Mean over micro-batches and data-parallel replicas, broadcast along the pipe."""
        loss = torch.zeros((), dtype=torch.float32, device=self.device)
        if self.is_last_stage():
            loss = torch.stack([torch.as_tensor(v, dtype=torch.float32).reshape(())
                                for v in losses]).sum() / count
            if self.dp_world_size > 1:
                dist.all_reduce(loss, group=self.dp_group)
                loss /= self.dp_world_size
        if self.num_stages > 1:
            dist.broadcast(loss, src=self.last_stage_rank, group=self.pipe_group)
        return loss

    def _eval_result(self, reduce_output, bcast_loss, count):
        if reduce_output is None:
            return list(self.losses) if self.is_last_stage() else None
        if not self._compute_loss:
            # no loss: the outputs themselves, averaged on the last stage only (as upstream)
            return self._mean_outputs(count) if self.is_last_stage() else None
        if bcast_loss:
            return self._aggregate_loss(self.losses, count)
        if not self.is_last_stage():
            return None
        loss = torch.stack([v.float().reshape(()) for v in self.losses]).sum() / count
        if self.dp_world_size > 1:
            dist.all_reduce(loss, group=self.dp_group)
            loss /= self.dp_world_size
        return loss

    def _mean_outputs(self, count):
        """The last stage's outputs averaged elementwise over the micro-batches and the
        data-parallel replicas (a tuple position by position), in fp32."""
        def mean(values):
            total = torch.stack([v.detach().float() for v in values]).sum(0) / count
            if self.dp_world_size > 1:
                dist.all_reduce(total, group=self.dp_group)
                total /= self.dp_world_size
            return total

        if torch.is_tensor(self.losses[0]):
            return mean(self.losses)
        return tuple(mean(parts) for parts in zip(*self.losses))

    # ------------------------------------------------------------------ checkpoints
    # ``save_checkpoint`` writes the layers into their own files (``layer_XX-model_states.pt``,
    # one per global layer, any number of stages can read them) and stores ``module: None`` in
    # the model-states file; ``load_checkpoint`` reads them back (see ``deepspeed.pipe.plugin``).
    _curr_ckpt_path = None  # the checkpoint directory while save/load_checkpoint runs

    def module_state_dict(self, exclude_frozen_parameters=False):
        """Write this stage's layers into the checkpoint being saved; returns None. Only
        ``save_checkpoint()`` may call it: elsewhere use ``PipelineModule.save_state_dict()``."""
        assert self._curr_ckpt_path is not None, \
            "PipelineEngine expects module_state_dict() to be called from save_checkpoint()"
        self.module.save_state_dict(self._curr_ckpt_path,
                                    exclude_frozen_params=exclude_frozen_parameters)
        return None

    def load_module_state_dict(self, checkpoint, strict=True, custom_load_fn=None,
                               fetch_z3_params=False):
        """Load the layers from a checkpoint directory (pipeline models checkpoint per layer):
        ``checkpoint`` is that directory (``save_dir/tag``), or a loaded model-states dict whose
        ``module`` is None or a directory (read from the checkpoint being loaded). A dict of
        weights (``module`` holding them, or the weights themselves) is loaded into the stage's
        module as the base engine would."""
        assert custom_load_fn is None, "custom_load_fn not supported w. pipeline parallelism"
        if isinstance(checkpoint, dict) and "module" in checkpoint:
            checkpoint = checkpoint["module"]
        if checkpoint is None:
            checkpoint = self._curr_ckpt_path
            assert checkpoint is not None, (
                "load_module_state_dict(None) reads the checkpoint being loaded; outside "
                "load_checkpoint() pass the checkpoint directory")
        if isinstance(checkpoint, dict):
            return self.module.load_state_dict(checkpoint, strict=strict)
        self.module.load_state_dir(os.fspath(checkpoint), strict=strict)
        return None

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False, custom_load_fn=None):
        assert custom_load_fn is None, "custom_load_fn not supported w. pipeline parallelism"
        return super().load_checkpoint(
            load_dir, tag=tag, load_module_strict=load_module_strict,
            load_optimizer_states=load_optimizer_states,
            load_lr_scheduler_states=load_lr_scheduler_states,
            load_module_only=load_module_only)

    # ------------------------------------------------------------------ clipping, progress
    def gradient_norm_group(self):
        """Clipping measures the norm over every stage's gradients (tied copies counted once):
        the precision policy (or ZeRO-1's partitions) sums over the pipe group too."""
        return self.pipe_group if self.num_stages > 1 else None

    def progress_report(self):
        """Upstream's pipeline line: the batch's loss and this batch's iteration time."""
        elapsed = time.time() - self._batch_started if self._batch_started else float("nan")
        loss = float(self.agg_train_loss) if self.agg_train_loss is not None else float("nan")
        return (f"steps: {self.global_steps} loss: {loss:0.4f} iter time (s): {elapsed:0.3f} "
                f"samples/sec: {self.train_batch_size() / elapsed:0.3f}")

    # the method executing each instruction of a schedule (upstream's name)
    _INSTRUCTION_MAP = {
        schedule.LoadMicroBatch: _exec_load_micro_batch,
        schedule.ForwardPass: _exec_forward_pass,
        schedule.BackwardPass: _exec_backward_pass,
        schedule.SendActivation: _exec_send_activation,
        schedule.RecvActivation: _exec_recv_activation,
        schedule.SendGrad: _exec_send_grad,
        schedule.RecvGrad: _exec_recv_grad,
        schedule.ReduceTiedGrads: _exec_reduce_tied_grads,
        schedule.ReduceGrads: _exec_reduce_grads,
        schedule.OptimizerStep: _exec_optimizer_step,
    }


def _to(value, device, float_dtype=None):
    if torch.is_tensor(value):
        if float_dtype is not None and value.is_floating_point():
            return value.to(device=device, dtype=float_dtype)
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return tuple(_to(v, device, float_dtype) for v in value)
    return value
