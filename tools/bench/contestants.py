"""The contestants of ``engine_vs_ddp.py`` and ``zero_bench.py``: one training step of the same GPT.

- ``engine``: our ``DeepSpeedEngine`` at ZeRO stage 0 (``deepspeed.initialize``);
- ``stage0`` / ``stage1`` / ``stage2`` / ``stage2_overlap`` / ``stage2_offload``: the same
  engine with a ``zero_optimization`` section (``ZeroContestant``, used by ``zero_bench.py``);
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
    """Per-phase wall time of the current step, summed over a round (a subclass names other
    phases: ``pipe_bench.py``'s)."""

    NAMES = ("forward", "backward", "allreduce", "grad_norm", "optimizer")

    def __init__(self):
        self.reset()

    def reset(self):
        self.totals = dict.fromkeys(self.NAMES, 0.0)

    def add(self, name, seconds):
        """``name`` may be outside NAMES (ZeRO's all-gather): it starts at zero then."""
        self.totals[name] = self.totals.get(name, 0.0) + seconds


def timed(phases, name, fn):
    """Wrap ``fn`` so each call adds its wall time to ``phases[name]``."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases.add(name, time.perf_counter() - start)
    return wrapper


def wrap_methods(phases, wraps):
    """Time each ``(owner, method name, phase)`` of ``wraps`` into ``phases``, on that instance
    only. The engines are still evolving, so a method that is gone leaves its phase unmeasured
    (or partly) with a warning, rather than failing the benchmark."""
    for owner, method, phase in wraps:
        if hasattr(owner, method):
            setattr(owner, method, timed(phases, phase, getattr(owner, method)))
        else:
            print(f"warning: {type(owner).__name__}.{method} not found; phase '{phase}' is "
                  f"not (fully) measured", file=sys.stderr)


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))


def optimizer_state_bytes(optimizer):
    """Bytes of every tensor in ``optimizer.state`` (Adam's moments, step counters)."""
    return sum(tensor_bytes(state.values()) for state in optimizer.state.values())


class EngineContestant:
    name = "engine"

    def __init__(self, args, model_cfg):
        import deepspeed

        torch.manual_seed(0)
        self.engine, _, _, _ = deepspeed.initialize(model=GPT(model_cfg),
                                                    config=self.config(args))
        optimizer = getattr(self.engine, "basic_optimizer", None) or self.engine.optimizer
        self.optimizer_name = f"{type(optimizer).__module__}.{type(optimizer).__name__}"
        self.phases = None

    def config(self, args):
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
        return config

    def instrument(self, phases):
        """Time the engine's own phases by wrapping its methods on this instance only."""
        self.phases = phases
        e = self.engine
        optimizer = getattr(e, "basic_optimizer", None) or e.optimizer
        wrap_methods(phases, ((e, "allreduce_gradients", "allreduce"),
                              (e, "_clip_gradients", "grad_norm"),
                              (optimizer, "step", "optimizer")))

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

    def state_bytes(self):
        """(fp32 master weights, optimizer state, gradient partition) bytes on this rank; at
        stage 0 the model's own fp32 weights are the master copy."""
        optimizer = getattr(self.engine, "basic_optimizer", None) or self.engine.optimizer
        return tensor_bytes(self.parameters()), optimizer_state_bytes(optimizer), 0

    def destroy(self):
        self.engine.destroy()


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

    def state_bytes(self):
        return tensor_bytes(self.parameters()), optimizer_state_bytes(self.optimizer), 0

    def destroy(self):
        pass


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

    def state_bytes(self):
        return tensor_bytes(self.params), optimizer_state_bytes(self.optimizer), 0

    def destroy(self):
        pass


class ZeroContestant(EngineContestant):
    """The engine with a ``zero_optimization`` section. Stages 0-3 step the optimizer that
    ``--engine_optimizer`` picks (by default torch's AdamW, DDP's optimizer, so the weights must
    match DDP's; ``config``: DeepSpeedCPUAdam, what a CPU user's ``AdamW`` gets); the CPU-offload
    contestant always steps DeepSpeedCPUAdam (offload refuses a torch optimizer unless
    ``zero_force_ds_cpu_optimizer: false``)."""

    stage, overlap_comm, offload, reduce_scatter = 0, False, False, True

    def config(self, args):
        config = super().config(args)
        zero = {"stage": self.stage, "overlap_comm": self.overlap_comm,
                "reduce_scatter": self.reduce_scatter}
        if getattr(args, "reduce_bucket_size", None):
            zero["reduce_bucket_size"] = args.reduce_bucket_size
        if self.offload:
            zero["offload_optimizer"] = {"device": "cpu"}
            config["optimizer"]["params"].pop("torch_adam", None)
        config["zero_optimization"] = zero
        return config

    def instrument(self, phases):
        """Phases of a ZeRO step: ``allreduce`` is the bucket reduce-scatter (stage 2: the
        launches and waits inside backward; stage 1: all of it, at the boundary), ``optimizer``
        the basic optimizer on the partition, ``allgather`` publishing the updated pieces."""
        if self.stage == 0:
            return super().instrument(phases)
        self.phases = phases
        e, zero = self.engine, self.engine.optimizer
        reducer = zero.reducer
        wraps = [(e, "_clip_gradients", "grad_norm"), (zero.optimizer, "step", "optimizer"),
                 (zero, "_write_back", "optimizer"), (zero, "after_optimizer_step", "allgather")]
        if self.stage >= 2:
            wraps += [(reducer, "_launch", "allreduce"), (reducer, "_complete", "allreduce")]
        else:
            wraps += [(reducer, "reduce_param_grads", "allreduce")]
        wrap_methods(phases, wraps)

    def parameters(self):
        """ZeRO-3 holds shards: gather full copies for the agreement check."""
        if self.stage < 3:
            return super().parameters()
        from deepspeed.zero import GatheredParameters

        params = super().parameters()
        with GatheredParameters(params):
            return [p.detach().clone() for p in params]

    def state_bytes(self):
        if self.stage == 0:
            return super().state_bytes()
        zero = self.engine.optimizer
        return (tensor_bytes(zero.master_params()), optimizer_state_bytes(zero.optimizer),
                tensor_bytes(zero.grad_partitions))


def _zero(name, stage, overlap_comm=False, offload=False, reduce_scatter=True):
    return type(f"Zero{name.title().replace('_', '')}Contestant", (ZeroContestant,),
                {"name": name, "stage": stage, "overlap_comm": overlap_comm, "offload": offload,
                 "reduce_scatter": reduce_scatter})


class FSDP2Contestant(DDPContestant):
    """torch's FSDP2: ``fully_shard`` on every block, then on the whole model (the layout
    torchtitan uses), with torch's AdamW stepping the sharded DTensor parameters."""

    name = "FSDP2"

    def __init__(self, args, model_cfg):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        model = GPT(model_cfg)
        mesh = init_device_mesh("cpu", (tdist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        self.model = fully_shard(model, mesh=mesh)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, **OPTIMIZER)
        self.phases = None

    def parameters(self):
        return [p.full_tensor() for p in self.model.parameters()]

    def state_bytes(self):
        local = [p.to_local() for p in self.model.parameters()]
        state = sum(tensor_bytes([v.to_local() if hasattr(v, "to_local") else v
                                  for v in st.values()])
                    for st in self.optimizer.state.values())
        return tensor_bytes(local), state, 0


class ZeroHeapBuffersContestant(ZeroContestant):
    """ZeRO-3 with overlap, its big per-step buffers taken from glibc's heap instead of their
    own mappings (``deepspeed.utils.transient_buffers``): what the mappings cost in step time
    (fresh pages to fault in and zero every step) against what they save in peak RSS."""

    name, stage, overlap_comm = "stage3_heap", 3, True

    def step(self, x, y):
        from deepspeed.utils import transient_buffers

        saved = transient_buffers.MIN_UNHEAPED_BYTES
        transient_buffers.MIN_UNHEAPED_BYTES = float("inf")
        try:
            super().step(x, y)
        finally:
            transient_buffers.MIN_UNHEAPED_BYTES = saved


# *_allreduce: "reduce_scatter": false, the documented alternative (all-reduce, keep one's piece)
ZERO_CONTESTANTS = (_zero("stage0", 0), _zero("stage1", 1), _zero("stage2", 2),
                    _zero("stage2_overlap", 2, overlap_comm=True),
                    _zero("stage2_offload", 2, offload=True),
                    _zero("stage1_allreduce", 1, reduce_scatter=False),
                    _zero("stage2_allreduce", 2, reduce_scatter=False),
                    _zero("stage3", 3), _zero("stage3_overlap", 3, overlap_comm=True),
                    ZeroHeapBuffersContestant)
CONTESTANTS = {c.name: c for c in (EngineContestant, DDPContestant, FlatAllreduceContestant,
                                   FSDP2Contestant, *ZERO_CONTESTANTS)}
