"""The contestants of ``engine_vs_ddp.py``: one training step of the same GPT three ways.

- ``engine``: our ``DeepSpeedEngine`` at ZeRO stage 0 (``deepspeed.initialize``);
- ``DDP``: ``torch.nn.parallel.DistributedDataParallel`` + ``torch.optim.AdamW``, the target;
- ``flat``: a hand-written loop doing what the core engine does (backward, then one all-reduce
  of all gradients flattened, then AdamW) with none of the engine around it. engine vs flat is
  the engine's own overhead; flat vs DDP is the reduction strategy (DDP overlaps bucketed
  all-reduces with the backward pass).

Every contestant starts from ``torch.manual_seed(0)`` weights, so all of them are identical.
``instrument(phases)`` makes the next steps add per-phase wall time to ``phases``.
"""
import sys
import time

import torch
import torch.distributed as tdist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from gpt import GPT

OPTIMIZER = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}


class Phases:
    """Per-phase wall time of the current step, summed over a round."""

    NAMES = ("forward", "backward", "allreduce", "grad_norm", "optimizer")

    def __init__(self):
        self.reset()

    def reset(self):
        self.totals = dict.fromkeys(self.NAMES, 0.0)

    def add(self, name, seconds):
        self.totals[name] += seconds


def timed(phases, name, fn):
    """Wrap ``fn`` so each call adds its wall time to ``phases[name]``."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases.add(name, time.perf_counter() - start)
    return wrapper


class EngineContestant:
    name = "engine"

    def __init__(self, args, model_cfg):
        import deepspeed

        torch.manual_seed(0)
        config = {
            "train_micro_batch_size_per_gpu": args.micro_batch,
            "gradient_accumulation_steps": 1,
            "steps_per_print": 10 ** 9,  # no progress logging inside the timed steps
            # no zero_optimization section: ZeRO stage 0, the core engine's own data parallelism
            "optimizer": {"type": "AdamW", "params": {"lr": args.lr, **OPTIMIZER,
                                                      "betas": list(OPTIMIZER["betas"])}},
        }
        if args.engine_optimizer == "torch":
            config["optimizer"]["params"]["torch_adam"] = True
        self.engine, _, _, _ = deepspeed.initialize(model=GPT(model_cfg), config=config)
        optimizer = getattr(self.engine, "basic_optimizer", None) or self.engine.optimizer
        self.optimizer_name = f"{type(optimizer).__module__}.{type(optimizer).__name__}"
        self.phases = None

    def instrument(self, phases):
        """Time the engine's own phases by wrapping its methods on this instance only. The
        engine is still evolving, so a method that is gone leaves its phase unmeasured (0)
        with a warning, rather than failing the benchmark."""
        self.phases = phases
        e = self.engine
        optimizer = getattr(e, "basic_optimizer", None) or e.optimizer
        for owner, method, phase in ((e, "allreduce_gradients", "allreduce"),
                                     (e, "_clip_gradients", "grad_norm"),
                                     (optimizer, "step", "optimizer")):
            if hasattr(owner, method):
                setattr(owner, method, timed(phases, phase, getattr(owner, method)))
            else:
                print(f"warning: {type(owner).__name__}.{method} not found; phase '{phase}' "
                      f"is not measured", file=sys.stderr)

    def step(self, x, y):
        e = self.engine
        if self.phases is None:
            e.backward(e(x, y))
            e.step()
            return
        t0 = time.perf_counter()
        loss = e(x, y)
        t1 = time.perf_counter()
        self.phases.add("forward", t1 - t0)
        before = dict(self.phases.totals)
        e.backward(loss)
        inner = self.phases.totals["allreduce"] - before["allreduce"]
        self.phases.add("backward", time.perf_counter() - t1 - inner)
        e.step()

    def parameters(self):
        return list(self.engine.module.parameters())


class DDPContestant:
    name = "DDP"

    def __init__(self, args, model_cfg):
        torch.manual_seed(0)
        self.model = torch.nn.parallel.DistributedDataParallel(GPT(model_cfg))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, **OPTIMIZER)
        self.phases = None

    def instrument(self, phases):
        self.phases = phases
        self.optimizer.step = timed(phases, "optimizer", self.optimizer.step)

    def step(self, x, y):
        if self.phases is None:
            self.model(x, y).backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            return
        t0 = time.perf_counter()
        loss = self.model(x, y)
        t1 = time.perf_counter()
        # DDP's all-reduce runs inside backward (bucket hooks), so it is part of this figure
        loss.backward()
        self.phases.add("forward", t1 - t0)
        self.phases.add("backward", time.perf_counter() - t1)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def parameters(self):
        return list(self.model.module.parameters())


class FlatAllreduceContestant:
    name = "flat"

    def __init__(self, args, model_cfg):
        torch.manual_seed(0)
        self.model = GPT(model_cfg)
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=args.lr, **OPTIMIZER)
        self.world = tdist.get_world_size()
        self.phases = None

    def instrument(self, phases):
        self.phases = phases
        self.allreduce = timed(phases, "allreduce", self.allreduce)
        self.optimizer.step = timed(phases, "optimizer", self.optimizer.step)

    def allreduce(self):
        grads = [p.grad for p in self.params]
        flat = _flatten_dense_tensors(grads)
        tdist.all_reduce(flat)
        flat.div_(self.world)
        for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(reduced)

    def step(self, x, y):
        t0 = time.perf_counter()
        loss = self.model(x, y)
        t1 = time.perf_counter()
        loss.backward()
        if self.phases is not None:
            self.phases.add("forward", t1 - t0)
            self.phases.add("backward", time.perf_counter() - t1)
        self.allreduce()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def parameters(self):
        return self.params


CONTESTANTS = {c.name: c for c in (EngineContestant, DDPContestant, FlatAllreduceContestant)}
