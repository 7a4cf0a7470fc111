"""``ZenFlowZeroOptimizer``: ZeRO stage 2/3 with CPU optimizer offload, where only the important
gradient columns are stepped every step, on the device, and the rest every ``update_interval``
steps by the CPU.

Per optimizer step (after ``full_warm_up_rounds`` plain ZeRO-Offload steps):

    land        a CPU step still running from the last boundary (``overlap_step``) is joined,
                and its result, the unimportant elements, is written into the model
    re-select   at an update boundary (nothing pending), every ``select_interval`` steps: the
                device's copies go back into the host masters / Adam state, the top-k columns
                are chosen from this step's gradient (``selection``), and their masters and
                Adam moments are copied to the device
    device      Adam on the important elements (master copies + moments on the device), written
                straight into the model's buffers
    accumulate  the whole gradient partition is added to a host accumulator
    boundary    every ``update_interval`` steps the CPU steps Adam over the partition with the
                mean accumulated gradient (in a background thread with ``overlap_step``, so the
                next forward/backward runs meanwhile and its result lands one step later); the
                important elements it also touched are superseded by the device's copies

The host step uses the same Adam math as ``DeepSpeedCPUAdam`` (``deepspeed.ops.adam.functional``),
called directly with hyper-parameters read at launch, so an LR scheduler stepping in the main
thread cannot race the background step. The device Adam counts one step per optimizer step; the
host state counts its own (fewer) steps for bias correction.
"""
import threading

import torch

from deepspeed.accelerator import get_accelerator
from deepspeed.ops.adam.functional import adam_update_
from deepspeed.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from deepspeed.zero.zenflow.selection import important_positions

ADAM_STATE = ("exp_avg", "exp_avg_sq")
STEPS_KEY = "zenflow_steps"  # optimizer steps taken, kept in the host state for checkpoints


def check_zenflow_setup(optimizer, offload_device, nvme):
    """ZenFlow's preconditions, each refused with the key that fixes it."""
    if offload_device != "cpu" or nvme:
        raise ValueError('zero_optimization.zenflow needs zero_optimization.offload_optimizer '
                         '{"device": "cpu"} (ZenFlow extends ZeRO-Offload), got '
                         f'{"nvme" if nvme else offload_device or "no offload"}')
    if tuple(getattr(optimizer, "state_keys", ())) != ADAM_STATE \
            or not hasattr(optimizer, "adamw_mode"):
        raise ValueError(f"zero_optimization.zenflow works with Adam/AdamW (DeepSpeedCPUAdam, "
                         f"from an 'optimizer' section of type Adam or AdamW), got "
                         f"{type(optimizer).__name__}")


class _Pending:
    """A host Adam step running in a background thread; ``join`` re-raises its error."""

    def __init__(self, work):
        self.error = None
        self.thread = threading.Thread(target=self._run, args=(work,), name="zenflow-cpu-step",
                                       daemon=True)
        self.thread.start()

    def _run(self, work):
        try:
            work()
        except BaseException as exc:  # re-raised in the training thread by join()
            self.error = exc

    def join(self):
        self.thread.join()
        if self.error is not None:
            raise RuntimeError("ZenFlow's background CPU optimizer step failed") from self.error


class ZenFlowZeroOptimizer(DeepSpeedZeroOptimizer):
    def __init__(self, optimizer, *, zenflow, **kwargs):
        check_zenflow_setup(optimizer, kwargs.get("offload_device"),
                            kwargs.get("nvme_swapper") is not None)
        super().__init__(optimizer, **kwargs)
        if any(comm[0] is not self.dp_group for comm in self.group_comms):
            self.reducer.detach_hooks()
            raise NotImplementedError("zero_optimization.zenflow: param groups reduced over "
                                      "their own process group (MoE experts) are not supported")
        self.zenflow = zenflow
        self.update_interval = zenflow.resolved_update_interval
        self.select_interval = zenflow.resolved_select_interval
        self.warm_up = int(zenflow.full_warm_up_rounds)
        self.device = next((b.device for layout in self.layouts for b in layout.buckets),
                           torch.device(get_accelerator().current_device_name()))
        self.steps = 0  # optimizer steps taken, warm-up included
        self.selected = None  # per group: important positions in this rank's partition
        self.selected_at = 0
        self.on_device = None  # per group: (masters, exp_avg, exp_avg_sq) of those positions
        self.writes = None  # per group: [(bucket, positions in its piece, rows of on_device)]
        self.accumulated = [torch.zeros_like(g) for g in self.grad_partitions]
        self.spare = [torch.zeros_like(g) for g in self.grad_partitions]  # the thread's buffer
        self.accumulated_steps = 0
        self.pending = None
        self._covered = None  # parameter elements in this rank's partitions
        for chunk in self.all_chunks:
            self._host_state(chunk)

    # ------------------------------------------------------------------ host Adam state
    def _host_state(self, chunk):
        state = self.optimizer.state[chunk]
        if not state:
            state["step"] = 0
            for key in ADAM_STATE:
                state[key] = torch.zeros_like(chunk, dtype=torch.float32)
        return state

    def _partition_views(self, group, key):
        """[(start, tensor)] over the chunks of ``group``: masters (key None) or a state."""
        out = []
        for chunk in self.chunks[group]:
            start = self._chunk_starts[id(chunk)][1]
            out.append((start, chunk.data if key is None else self._host_state(chunk)[key]))
        return out

    def _gather(self, group, key, positions):
        values = torch.empty(positions.numel(), dtype=torch.float32, device=self.master_device)
        for start, tensor in self._partition_views(group, key):
            mask = (positions >= start) & (positions < start + tensor.numel())
            values[mask] = tensor.view(-1)[positions[mask] - start].float()
        return values

    def _scatter(self, group, key, positions, values):
        values = values.to(self.master_device)
        for start, tensor in self._partition_views(group, key):
            mask = (positions >= start) & (positions < start + tensor.numel())
            tensor.view(-1)[positions[mask] - start] = values[mask].to(tensor.dtype)

    # ------------------------------------------------------------------ the step
    def _optimizer_step(self):
        self._land()
        if self.steps < self.warm_up:
            super()._optimizer_step()  # plain ZeRO-Offload
            self.steps += 1
            return
        since = self.steps - self.warm_up
        if self.selected is None or (self.accumulated_steps == 0
                                     and since - self.selected_at >= self.select_interval):
            self._select(since)
        self._device_step()
        for acc, grads in zip(self.accumulated, self.grad_partitions):
            acc.add_(grads)
        self.accumulated_steps += 1
        self.steps += 1
        if self.accumulated_steps == self.update_interval:
            self._launch_host_step()

    def _select(self, since):
        if self.selected is not None:
            self._sync_host()
        self.selected = important_positions(self, float(self.zenflow.topk_ratio))
        self.selected_at = since
        self.on_device, self.writes = [], []
        for group, positions in enumerate(self.selected):
            self.on_device.append(tuple(self._gather(group, key, positions).to(self.device)
                                        for key in (None,) + ADAM_STATE))
            self.writes.append(self._plan_writes(group, positions))

    def _plan_writes(self, group, positions):
        plan = []
        for bucket in self.layouts[group].buckets:
            lo = bucket.partition_offset
            rows = ((positions >= lo) & (positions < lo + bucket.piece)).nonzero().view(-1)
            if rows.numel():
                plan.append((bucket, (positions[rows] - lo).to(bucket.device),
                             rows.to(self.device)))
        return plan

    def _sync_host(self):
        """Copy the device's masters and moments of the important positions into the host ones
        (before re-selection and checkpoints)."""
        if self.selected is None:
            return
        for group, positions in enumerate(self.selected):
            for key, values in zip((None,) + ADAM_STATE, self.on_device[group]):
                self._scatter(group, key, positions, values)

    def _device_step(self):
        step = self.steps + 1
        for group, positions in enumerate(self.selected):
            if not positions.numel():
                continue
            masters, exp_avg, exp_avg_sq = self.on_device[group]
            grads = self.grad_partitions[group][positions].to(self.device)
            adam_update_([masters], [grads], [exp_avg], [exp_avg_sq], step=step,
                         **self._hyper(group))
            self._write_selected(group)

    def _write_selected(self, group):
        masters = self.on_device[group][0]
        with torch.no_grad():
            for bucket, local, rows in self.writes[group]:
                piece = bucket.piece_of(self._rank_in(bucket))
                piece.index_copy_(0, local, masters[rows].to(piece.dtype))
                bucket.settle()

    def _hyper(self, group):
        options = self.optimizer.param_groups[group]
        beta1, beta2 = options["betas"]
        return dict(lr=options["lr"], beta1=beta1, beta2=beta2, eps=options["eps"],
                    weight_decay=options["weight_decay"],
                    bias_correction=options.get("bias_correction", True),
                    adamw_mode=self.optimizer.adamw_mode)

    def _unimportant_count(self):
        """Parameter elements of this rank's partitions the device does not step (bucket
        padding is no parameter's)."""
        if self._covered is None:
            self._covered = sum(self.fragment_of(p).length
                                for params in self.partitioned_params for p in params)
        return self._covered - sum(int(s.numel()) for s in self.selected)

    def _launch_host_step(self):
        self.accumulated, self.spare = self.spare, self.accumulated
        grads, count = self.spare, self.accumulated_steps
        self.accumulated_steps = 0
        if self._unimportant_count() == 0:  # topk_ratio 1: the device did everything
            for g in grads:
                g.zero_()
            return
        hypers = [self._hyper(g) for g in range(len(self.chunks))]  # read now: no LR race
        work = lambda: self._host_step(grads, count, hypers)  # noqa: E731
        self.pending = _Pending(work) if self.zenflow.overlap_step else None
        if self.pending is None:
            work()
            self._write_host_result()

    def _host_step(self, grads, count, hypers):
        with torch.no_grad():
            for group, chunks in enumerate(self.chunks):
                grads[group].div_(count)
                for chunk in chunks:
                    state = self._host_state(chunk)
                    state["step"] += 1
                    start = self._chunk_starts[id(chunk)][1]
                    adam_update_([chunk.data], [grads[group].narrow(0, start, chunk.numel())],
                                 [state["exp_avg"]], [state["exp_avg_sq"]], step=state["step"],
                                 **hypers[group])
                grads[group].zero_()

    def _write_host_result(self):
        """The host masters into the model, then the device's newer important elements."""
        for group, chunks in enumerate(self.chunks):
            for chunk, segments in zip(chunks, self._segments[group]):
                self._write_back(chunk, segments)
            self._write_selected(group)

    def _land(self):
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.join()
            self._write_host_result()

    def flush(self):
        """Finish a background step (publishing its result to every rank) and make the host
        masters and Adam state current, the device's important elements included: before
        reading or saving optimizer state. A collective, like the step."""
        if self.pending is not None:
            self._land()
            self._publish()
        self._sync_host()
        for chunk in self.all_chunks:  # a scalar, so ZeRO's checkpoints carry it
            self._host_state(chunk)[STEPS_KEY] = self.steps

    def state_loaded(self):
        """After host masters and state were replaced (a checkpoint): forget the selection and
        the accumulated gradient, and resume the step count the checkpoint carries (the device
        Adam's bias correction and the warm-up depend on it)."""
        self.selected = None  # re-selected, and re-seeded from the loaded state, next step
        for acc in self.accumulated:
            acc.zero_()
        self.accumulated_steps = 0
        saved = [self.optimizer.state.get(c, {}).get(STEPS_KEY) for c in self.all_chunks]
        saved = [int(s) for s in saved if s is not None]
        if saved:
            self.steps = max(saved)

    # ------------------------------------------------------------------ state access
    def state_dict(self):
        self.flush()
        return super().state_dict()

    def load_state_dict(self, state_dict, load_from_fp32_weights=None):
        self.flush()
        super().load_state_dict(state_dict, load_from_fp32_weights)
        self.state_loaded()

    def get_full_hp_param(self, param, optim_state_key=None):
        self.flush()
        return super().get_full_hp_param(param, optim_state_key)

    def get_local_hp_param(self, param, optim_state_key=None):
        self.flush()
        return super().get_local_hp_param(param, optim_state_key)

    def destroy(self):
        if self.pending is not None:
            self.pending.join()  # not a collective: ranks may be torn down one by one
            self.pending = None
        super().destroy()
