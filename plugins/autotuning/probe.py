"""What runs inside an experiment: measure the steps between the profile steps, then exit.

The autotuner launches each experiment as an ordinary training job whose config carries
``autotuning.metric_path`` (or ``autotuning.model_info.profile`` for the profiling run). The
probe reads the engine's own timers (``forward``, ``backward``, ``step``; the experiment config
turns ``wall_clock_breakdown`` on) for every micro-step of the optimizer steps
``start_profile_step < n <= end_profile_step``, writes the metrics on rank 0 and ends the process
(the rest of the user's script never runs: the experiment has answered its question).

The profiling run (measuring the same steps as every experiment) records the model's parameter
count (and each parameter's size, in order), the timing metrics of its own steps (what
``deepspeed.plan``'s estimate is calibrated with), the activation memory one sample keeps for
backward (the bytes autograd saves during the first forward, parameters excluded) and the
forward flops per sample (``torch.utils.flop_counter``), then exits after one step.
"""
import json
import os
import sys
import time

import torch

from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator

PHASES = ("forward", "backward", "step")


def atomic_json(path, data):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
    os.replace(tmp, path)


def memory_per_rank():
    """Bytes one rank may use: the device's memory, or on CPU this node's available memory
    shared by its ranks (``DS_AUTOTUNING_MEMORY_PER_RANK`` overrides both)."""
    override = os.environ.get("DS_AUTOTUNING_MEMORY_PER_RANK")
    if override:
        return int(float(override))
    accel = get_accelerator()
    if accel.device_name() == "cpu":
        local = int(os.environ.get("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1")) or 1)
        return int(accel.available_memory() // max(1, local))
    return int(accel.total_memory())


class _SavedBytes:
    """Counts the distinct non-parameter storages autograd saves during one forward."""

    def __init__(self, params):
        self.param_storages = {p.untyped_storage().data_ptr() for p in params}
        self.seen = set()
        self.bytes = 0
        self.context = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def pack(self, tensor):
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return tensor
        key = storage.data_ptr()
        if key not in self.param_storages and key not in self.seen:
            self.seen.add(key)
            self.bytes += storage.nbytes()
        return tensor


class ExperimentProbe:
    """Per-engine measurement state, driven by the autotuning plugin's hooks."""

    def __init__(self, engine, section):
        self.engine = engine
        self.section = section
        self.profile_model = bool(section.model_info and section.model_info.profile)
        self.phase_ms = {name: 0.0 for name in PHASES}
        self.measured_steps = 0
        self.pending = False  # a backward/step of the current micro-step still to be read
        self.window_start = None
        self.wall_s = 0.0
        self.saved = None
        self.flop_counter = None
        self.fwd_flops = None  # this rank's forward flops of one micro-batch
        self.activation_bytes = None

    # -- which steps count --------------------------------------------------------------
    def _measuring(self):
        n = self.engine.global_steps + 1  # the optimizer step this micro-step belongs to
        return self.section.start_profile_step < n <= self.section.end_profile_step

    def _read(self, name):
        value = self.engine.timers.last_ms(name)
        if value is not None and self._measuring():
            self.phase_ms[name] += value

    def _collect_pending(self):
        if self.pending:
            self._read("backward")
            self._read("step")
            self.pending = False

    # -- hooks ----------------------------------------------------------------------------
    def before_forward(self):
        self._collect_pending()
        if self._measuring() and self.window_start is None:
            self.window_start = time.perf_counter()
        if self.fwd_flops is None and self.flop_counter is None and self.engine.module.training:
            from torch.utils.flop_counter import FlopCounterMode

            self.flop_counter = FlopCounterMode(display=False)
            self.flop_counter.__enter__()
            if self.profile_model:
                self.saved = _SavedBytes(self.engine.module.parameters())
                self.saved.context.__enter__()

    def after_forward(self):
        if self.flop_counter is not None:
            if self.saved is not None:
                self.saved.context.__exit__(None, None, None)
                self.activation_bytes = self.saved.bytes
                self.saved = None
            self.flop_counter.__exit__(None, None, None)
            self.fwd_flops = int(self.flop_counter.get_total_flops())
            self.flop_counter = None

    def before_backward(self):
        self._read("forward")
        self.pending = True

    def after_step(self):
        measuring = self.section.start_profile_step < self.engine.global_steps <= \
            self.section.end_profile_step
        if self.pending and measuring:
            for name in ("backward", "step"):
                value = self.engine.timers.last_ms(name)
                self.phase_ms[name] += value or 0.0
        self.pending = False
        if measuring:
            self.measured_steps += 1
        if self.engine.global_steps >= self.section.end_profile_step:
            self.wall_s = time.perf_counter() - (self.window_start or time.perf_counter())
            if self.profile_model:  # the model's figures and how long its steps took
                self._finish(dict(self._model_info(), profile_metrics=self._metrics()),
                             self.section.model_info_path)
            self._finish(self._metrics(), self.section.metric_path)

    # -- results ----------------------------------------------------------------------------
    def _max_over_ranks(self, value):
        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def _sum_over_ranks(self, value):
        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t)
        return t.item()

    def _metrics(self):
        engine = self.engine
        steps = max(1, self.measured_steps)
        latency_ms = self._max_over_ranks(sum(self.phase_ms.values()) / steps)
        wall_ms = self._max_over_ranks(1000.0 * self.wall_s / steps)
        flops = self._sum_over_ranks(self.fwd_flops or 0) * engine.gradient_accumulation_steps()
        seconds = max(latency_ms, 1e-9) / 1000.0
        return {
            "latency": latency_ms,
            "throughput": engine.train_batch_size() / seconds,
            "FLOPS": 3.0 * flops / seconds,  # forward + backward (twice the forward)
            "wall_latency": wall_ms,
            "phases_ms": {k: v / steps for k, v in self.phase_ms.items()},
            "measured_steps": self.measured_steps,
            "train_batch_size": engine.train_batch_size(),
            "train_micro_batch_size_per_gpu": engine.train_micro_batch_size_per_gpu(),
            "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
            "zero_stage": engine.zero_optimization_stage(),
            "world_size": dist.get_world_size(),
        }

    def _model_info(self):
        module = self.engine.module
        params = list(module.parameters())
        micro = self.engine.train_micro_batch_size_per_gpu()
        info = {
            "num_params": int(sum(getattr(p, "ds_numel", p.numel()) for p in params)),
            "trainable_num_params": int(sum(getattr(p, "ds_numel", p.numel())
                                            for p in params if p.requires_grad)),
            # the order ZeRO fills its buckets in: deepspeed.plan cuts its collectives from it
            "param_numels": [int(getattr(p, "ds_numel", p.numel())) for p in params
                             if p.requires_grad],
            "bytes_per_param": int(params[0].element_size()) if params else 4,
            "activation_mem_per_sample": int(self._max_over_ranks(
                (self.activation_bytes or 0) / micro)),
            "fwd_flops_per_sample": int(self._max_over_ranks((self.fwd_flops or 0) / micro)),
            "memory_per_rank": int(self._max_over_ranks(-memory_per_rank()) * -1),
        }
        cfg = getattr(module, "config", None)
        for name, keys in (("hidden_size", ("hidden_size", "n_embd", "d_model")),
                           ("num_layers", ("num_hidden_layers", "n_layer", "num_layers"))):
            for key in keys:
                if isinstance(getattr(cfg, key, None), int):
                    info[name] = getattr(cfg, key)
                    break
        return info

    def _finish(self, data, path):
        if dist.get_rank() == 0 and path:
            atomic_json(path, data)
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the experiment is answered; the rest of the script must not run
