"""Pipeline parallelism (pp 2): our PipelineEngine against torch.distributed.pipelining and DDP.

    python tools/bench/pipe_bench.py                         # spawns 2 gloo ranks itself
    python tools/bench/pipe_bench.py --rounds 10 --steps 2   # quicker
    python tools/bench/pipe_bench.py --rss_each --rounds 2   # peak RSS per rank, one run each
    python tools/bench/pipe_bench.py --only deepspeed_pipe   # one contestant alone
    deepspeed --num_gpus 2 tools/bench/pipe_bench.py         # or through the launcher

The model is the demo's GPT (``examples/gpt.py``: its ``Block``; default 8 layers) written as a
list of layers: the embeddings (token + position), the blocks, the head (final LayerNorm + LM
head, untied from the embedding so that no weight crosses stages). Layer ``i`` initialises its
weights from its own ``torch.Generator`` seeded ``--seed + i``, so every contestant builds the
same weights whichever rank builds which layer. One training step is one global batch of
``--micro_batches`` micro-batches of ``--micro_batch`` sequences of the demo's Markov tokens:

- ``deepspeed_pipe``: ``PipelineModule(LayerSpecs, num_stages=2)`` + ``engine.train_batch``
  (1F1B), AdamW (``torch_adam: true``);
- ``torch_1f1b``: ``torch.distributed.pipelining``: ``PipelineStage`` + ``Schedule1F1B`` + AdamW
  per stage, the reference;
- ``torch_gpipe``: the same with ``ScheduleGPipe`` (all forwards, then all backwards);
- ``ddp``: ``DistributedDataParallel`` of the whole model, each rank one half of the global
  batch in one forward.

Both pipelines split the layers at the same point (``partition_method='uniform'``: embeddings
+ 4 blocks | 4 blocks + head for 8 layers). All contestants see the same global batches in the
same order and start from the same weights, so their losses must agree step by step and their
weights at the end: the tool prints both checks against DDP.

Timing is the method of ``engine_vs_ddp.py``: the contestants live in the same process pair and
take turns, ``--steps`` steps each per round, the order flipping every round; a step's time is
the slowest rank's; the figure is the median over rounds, every ratio is against ``torch_1f1b``
measured in the same run (also as the median of per-round paired ratios, and as a CPU-time
ratio, less sensitive to other load on the machine).

Bubble: each pipeline contestant's compute on each rank is timed (our engine: the ForwardPass /
BackwardPass instructions; torch: ``forward_one_chunk`` / ``backward_one_chunk`` and the loss),
and so is the time in point-to-point transfers (which, being blocking, is where a stage waits for
its neighbour) and the optimizer. The measured bubble fraction of a rank is
``1 - compute / (step - optimizer)``, the share of the pipelined part of the step the rank did
not compute, to compare with the theoretical ``(S-1)/(M+S-1)`` of equal stages and free
communication. ``ideal`` is what that formula predicts from the slowest stage's measured
compute: ``max compute * (M+S-1)/M + optimizer``. ``--no_breakdown`` drops the timers.

Peak RSS (``ru_maxrss``) is a process's high-water mark, so in the shared run it is one figure
for all contestants; ``--rss_each`` runs each contestant alone in a fresh process pair (as
``zero_bench.py``). It is a tool, never a test: nothing here asserts on time or memory.
"""
import argparse
import logging
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn import functional as F

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "examples"), str(HERE)]
from contestants import Phases as StepPhases, timed, wrap_methods  # noqa: E402
from engine_vs_ddp import max_abs_difference, report_rounds, run_ranks, slowest  # noqa: E402
from gpt import Block, GPTConfig, MarkovTokens  # noqa: E402
from zero_bench import gathered, peak_rss_mib, report_rss  # noqa: E402

NAMES = ("deepspeed_pipe", "torch_1f1b", "torch_gpipe", "ddp")
REFERENCE = "torch_1f1b"
STAGES = 2
OPTIMIZER = {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}
PHASES = ("compute", "p2p", "sync", "optimizer")


# ----------------------------------------------------------------------------- the model
def _init_weights(module, index, seed, n_layer):
    """GPT-2's init (as ``examples/gpt.py``), drawn from this layer's own generator."""
    g = torch.Generator().manual_seed(seed + index)
    for name, p in module.named_parameters():
        if p.dim() < 2:  # LayerNorm and Linear biases: LayerNorm weights stay 1, biases 0
            continue
        std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("attn.proj.weight",
                                                                "mlp.2.weight")) else 0.02
        with torch.no_grad():
            nn.init.normal_(p, 0.0, std, generator=g)


class Embeddings(nn.Module):
    def __init__(self, cfg, index, seed):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        _init_weights(self, index, seed, cfg.n_layer)

    def forward(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))


class GPTBlock(Block):
    def __init__(self, cfg, index, seed):
        super().__init__(cfg)
        for m in self.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        _init_weights(self, index, seed, cfg.n_layer)


class Head(nn.Module):
    def __init__(self, cfg, index, seed):
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        _init_weights(self, index, seed, cfg.n_layer)

    def forward(self, x):
        return self.lm_head(self.ln_f(x))


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def layer_specs(cfg, seed):
    from deepspeed.pipe import LayerSpec

    n = cfg.n_layer
    return ([LayerSpec(Embeddings, cfg, 0, seed)]
            + [LayerSpec(GPTBlock, cfg, i, seed) for i in range(1, n + 1)]
            + [LayerSpec(Head, cfg, n + 1, seed)])


def stage_bounds(cfg, seed):
    """Layer index bounds of each stage: the split our PipelineModule makes, used by torch too."""
    from deepspeed.pipe.layers import partition_layers

    return partition_layers(layer_specs(cfg, seed), STAGES, "uniform")


class Layers(nn.Sequential):
    """Some of the layers, remembering their global indices (for the weight check)."""

    def __init__(self, cfg, seed, start, stop):
        specs = layer_specs(cfg, seed)
        super().__init__(*(specs[i].build() for i in range(start, stop)))
        self.indices = list(range(start, stop))

    def by_layer(self):
        return {i: list(m.parameters()) for i, m in zip(self.indices, self)}


# ----------------------------------------------------------------------------- timers
class Phases(StepPhases):
    """Wall time per phase, summed over the steps of a round, on this rank."""

    NAMES = PHASES


class _P2PTimer:
    """torch's schedules call the module functions ``_batch_p2p`` / ``_sorted_batch_p2p`` /
    ``_wait_batch_p2p`` by name: route them through the phases of the contestant stepping."""

    current = None  # the Phases of the torch contestant now stepping, or None
    depth = 0  # _sorted_batch_p2p may call _batch_p2p: time the outermost call only

    @classmethod
    def install(cls):
        from torch.distributed.pipelining import schedules

        if getattr(schedules, "_pipe_bench_timed", False):
            return
        for fname in ("_batch_p2p", "_sorted_batch_p2p", "_wait_batch_p2p"):
            fn = getattr(schedules, fname, None)
            if fn is None:
                print(f"warning: torch.distributed.pipelining.schedules.{fname} not found; "
                      f"torch's p2p phase is partly unmeasured", file=sys.stderr)
                continue
            setattr(schedules, fname, cls._wrap(fn))
        schedules._pipe_bench_timed = True

    @classmethod
    def _wrap(cls, fn):
        def wrapper(*args, **kwargs):
            phases = cls.current
            if phases is None or cls.depth:
                return fn(*args, **kwargs)
            cls.depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                cls.depth -= 1
                phases.totals["p2p"] += time.perf_counter() - start
        return wrapper


# ----------------------------------------------------------------------------- contestants
class DeepSpeedPipe:
    name = "deepspeed_pipe"

    def __init__(self, args, cfg):
        import deepspeed
        from deepspeed.pipe import PipelineModule

        model = PipelineModule(layer_specs(cfg, args.seed), num_stages=STAGES, loss_fn=lm_loss,
                               partition_method="uniform")
        config = {"train_micro_batch_size_per_gpu": args.micro_batch,
                  "gradient_accumulation_steps": args.micro_batches,
                  "steps_per_print": 10 ** 9,
                  "optimizer": {"type": "AdamW",
                                "params": {"lr": args.lr, **OPTIMIZER,
                                           "betas": list(OPTIMIZER["betas"]), "torch_adam": True}}}
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=config)
        self.micro_batches = args.micro_batches
        self.phases = None
        self.is_last = self.engine.is_last_stage()

    def instrument(self, phases):
        self.phases = phases
        e = self.engine
        wrap_methods(phases, [(e, method, phase) for method, phase in (
            ("_exec_forward_pass", "compute"), ("_exec_backward_pass", "compute"),
            ("_exec_send_activation", "p2p"), ("_exec_recv_activation", "p2p"),
            ("_exec_send_grad", "p2p"), ("_exec_recv_grad", "p2p"), ("_fetch_batch", "sync"),
            ("_exec_reduce_tied_grads", "sync"), ("_exec_reduce_grads", "sync"),
            ("_exec_optimizer_step", "optimizer"))])

    def step(self, x, y):
        micro = zip(x.chunk(self.micro_batches), y.chunk(self.micro_batches))
        return self.engine.train_batch(iter(micro)).detach()  # the same mean on every rank

    def by_layer(self):
        module = self.engine.module
        start, stop = module.parts[module.stage_id], module.parts[module.stage_id + 1]
        return {i: list(getattr(module, str(i)).parameters()) for i in range(start, stop)}

    def destroy(self):
        self.engine.destroy()


class TorchPipe:
    schedule = None  # the class name in torch.distributed.pipelining

    def __init__(self, args, cfg):
        import torch.distributed.pipelining as pipelining

        rank = tdist.get_rank()
        bounds = stage_bounds(cfg, args.seed)
        self.model = Layers(cfg, args.seed, bounds[rank], bounds[rank + 1])
        self.stage = pipelining.PipelineStage(self.model, stage_index=rank, num_stages=STAGES,
                                              device=torch.device("cpu"))
        self.sched = getattr(pipelining, self.schedule)(self.stage,
                                                        n_microbatches=args.micro_batches,
                                                        loss_fn=lm_loss)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, **OPTIMIZER)
        self.is_first, self.is_last = rank == 0, rank == STAGES - 1
        self.phases = None

    def instrument(self, phases):
        self.phases = phases
        _P2PTimer.install()
        st, sc = self.stage, self.sched
        st.forward_one_chunk = timed(phases, "compute", st.forward_one_chunk)
        st.backward_one_chunk = timed(phases, "compute", st.backward_one_chunk)
        sc._maybe_compute_loss = timed(phases, "compute", sc._maybe_compute_loss)
        self.optimizer.step = timed(phases, "optimizer", self.optimizer.step)
        self.optimizer.zero_grad = timed(phases, "optimizer", self.optimizer.zero_grad)

    def step(self, x, y):
        _P2PTimer.current = self.phases
        try:
            self.optimizer.zero_grad(set_to_none=True)
            losses = [] if self.is_last else None
            self.sched.step(*((x,) if self.is_first else ()),
                            target=y if self.is_last else None, losses=losses,
                            return_outputs=False)
            self.optimizer.step()
        finally:
            _P2PTimer.current = None
        return torch.stack(losses).mean().detach() if self.is_last else None

    def by_layer(self):
        return self.model.by_layer()

    def destroy(self):
        pass


class Torch1F1B(TorchPipe):
    name, schedule = "torch_1f1b", "Schedule1F1B"


class TorchGPipe(TorchPipe):
    name, schedule = "torch_gpipe", "ScheduleGPipe"


class DDP:
    """Data parallel over the same 2 ranks: each rank runs the whole model on its half of the
    global batch (one forward of micro_batches / 2 micro-batches' sequences)."""

    name = "ddp"

    def __init__(self, args, cfg):
        self.layers = Layers(cfg, args.seed, 0, cfg.n_layer + 2)
        self.model = torch.nn.parallel.DistributedDataParallel(self.layers)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, **OPTIMIZER)
        self.rank, self.world = tdist.get_rank(), tdist.get_world_size()
        self.phases = None

    def instrument(self, phases):
        self.phases = phases
        self.optimizer.step = timed(phases, "optimizer", self.optimizer.step)

    def step(self, x, y):
        x, y = x.chunk(self.world)[self.rank], y.chunk(self.world)[self.rank]
        start = time.perf_counter()
        loss = lm_loss(self.model(x), y)
        loss.backward()  # the gradient all-reduce runs inside
        if self.phases is not None:
            self.phases.totals["compute"] += time.perf_counter() - start
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()  # this rank's half: the global loss is the mean over ranks

    def by_layer(self):
        return self.layers.by_layer()

    def destroy(self):
        pass


CONTESTANTS = {c.name: c for c in (DeepSpeedPipe, Torch1F1B, TorchGPipe, DDP)}


# ----------------------------------------------------------------------------- measuring
def global_batches(args, cfg):
    """Every global batch (inputs, labels), on every rank: each contestant takes its part."""
    per_batch = args.micro_batch * args.micro_batches
    data = MarkovTokens(samples=per_batch * args.batches, seq_len=cfg.block_size,
                        vocab_size=cfg.vocab_size, seed=1234)
    x, y = data.tokens[:, :-1], data.tokens[:, 1:]
    return [(x[i:i + per_batch].contiguous(), y[i:i + per_batch].contiguous())
            for i in range(0, len(data), per_batch)]


class Results:
    def __init__(self, names):
        self.wall = {n: [] for n in names}  # per round: slowest rank's mean step time
        self.cpu = {n: [] for n in names}
        self.local = {n: [] for n in names}  # per round: this rank's mean step time
        self.phases = {n: [] for n in names}  # per round: this rank's mean per phase
        self.losses = {n: [] for n in names}  # per step


def run_block(contestant, batches, cursor, steps, losses):
    tdist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(steps):
        x, y = batches[(cursor + i) % len(batches)]
        losses.append(contestant.step(x, y))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return wall, slowest(wall), slowest(cpu)


def measure(args, contestants, batches):
    results = Results([c.name for c in contestants])
    for c in contestants:
        run_block(c, batches, 0, args.warmup, results.losses[c.name])
        if args.breakdown:
            c.instrument(Phases())
    cursor = args.warmup
    for r in range(args.rounds):
        for c in (contestants if r % 2 == 0 else contestants[::-1]):
            if args.breakdown:
                c.phases.reset()
            local, wall, cpu = run_block(c, batches, cursor, args.steps, results.losses[c.name])
            results.wall[c.name].append(wall / args.steps)
            results.cpu[c.name].append(cpu / args.steps)
            results.local[c.name].append(local / args.steps)
            if args.breakdown:
                results.phases[c.name].append({k: v / args.steps
                                               for k, v in c.phases.totals.items()})
        cursor += args.steps
    return results


def start_worker(args):
    torch.set_num_threads(args.threads)
    import deepspeed
    from deepspeed import comm as dist

    deepspeed.init_distributed(dist_backend="gloo")
    if not args.verbose:  # the engine logs its whole config on rank 0
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != STAGES:
        raise SystemExit(f"pipe_bench runs on exactly {STAGES} ranks (pp {STAGES}), got {world}")
    cfg = GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                    n_head=args.n_head, n_embd=args.n_embd)
    return rank, world, cfg, global_batches(args, cfg)


def worker(args):
    rank, world, cfg, batches = start_worker(args)
    rss_before = gathered(peak_rss_mib())
    contestants = [CONTESTANTS[n](args, cfg) for n in args.names]
    results = measure(args, contestants, batches)
    rss_after = gathered(peak_rss_mib())
    losses = {c.name: gathered([None if v is None else float(v) for v in results.losses[c.name]])
              for c in contestants}
    local = {c.name: gathered(results.local[c.name]) for c in contestants}
    phases = {c.name: gathered(results.phases[c.name]) for c in contestants}
    params = {c.name: c.by_layer() for c in contestants}
    diffs = {}
    if "ddp" in params:
        for c in contestants:
            if c.name != "ddp":
                mine, ref = params[c.name], params["ddp"]
                diffs[c.name] = gathered(max(max_abs_difference(mine[i], ref[i]) for i in mine))
    if rank == 0:
        bounds = stage_bounds(cfg, args.seed)
        n_params = sum(p.numel() for ps in Layers(cfg, args.seed, 0, cfg.n_layer + 2).by_layer()
                       .values() for p in ps)
        print(f"GPT {n_params:,} params (n_layer={cfg.n_layer}, n_embd={cfg.n_embd}, "
              f"seq={cfg.block_size}, vocab={cfg.vocab_size}, head untied); global batch "
              f"{args.micro_batches} micro-batches x {args.micro_batch} sequences; stages: layers "
              f"{bounds[0]}-{bounds[1] - 1} | {bounds[1]}-{bounds[2] - 1} (of embeddings, "
              f"{cfg.n_layer} blocks, head); {world} gloo ranks x {args.threads} thread(s); "
              f"torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}")
        report_rounds(args)
        report_times(args, results, contestants)
        if args.breakdown:
            report_bubble(args, results, local, phases, contestants)
        report_rss(rss_before, rss_after, alone=len(contestants) == 1)
        report_agreement(args, losses, diffs)
    for c in contestants:
        c.destroy()
    tdist.barrier()
    tdist.destroy_process_group()


def report_times(args, results, contestants):
    names = [c.name for c in contestants]
    ref = REFERENCE if REFERENCE in names else names[0]
    med = {n: statistics.median(results.wall[n]) * 1e3 for n in names}
    cpu = {n: statistics.median(results.cpu[n]) * 1e3 for n in names}
    print(f"  {'contestant':15s} {'median ms':>9s} {'min':>7s} {'max':>7s} {'CPU ms':>7s}"
          + ("" if len(names) == 1 else f" {'/' + ref:>11s} {'paired':>7s} {'CPU/' + ref:>15s}"))
    for n in names:
        ms = sorted(t * 1e3 for t in results.wall[n])
        line = f"  {n:15s} {med[n]:9.2f} {ms[0]:7.2f} {ms[-1]:7.2f} {cpu[n]:7.2f}"
        if len(names) > 1:
            paired = statistics.median(a / b for a, b in zip(results.wall[n], results.wall[ref]))
            line += f" {med[n] / med[ref]:11.3f} {paired:7.3f} {cpu[n] / cpu[ref]:15.3f}"
        print(line)


def report_bubble(args, results, local, phases, contestants):
    m, s = args.micro_batches, STAGES
    theory = (s - 1) / (m + s - 1)
    print(f"per rank, median over rounds, ms per step (bubble = 1 - compute / (step - optimizer);"
          f" theoretical (S-1)/(M+S-1) = {s - 1}/{m + s - 1} = {theory:.3f}):")
    print(f"  {'contestant':15s} {'rank':>4s} {'step':>7s} {'compute':>8s} {'p2p':>7s} "
          f"{'sync':>7s} {'optim':>7s} {'other':>7s} {'bubble':>7s}")
    for c in contestants:
        for rank, (steps, rows) in enumerate(zip(local[c.name], phases[c.name])):
            step = statistics.median(steps) * 1e3
            ph = {k: statistics.median(r[k] for r in rows) * 1e3 for k in PHASES}
            bubbles = [1 - r["compute"] / (t - r["optimizer"]) for t, r in zip(steps, rows)]
            other = statistics.median(t - sum(r.values()) for t, r in zip(steps, rows)) * 1e3
            bubble = f"{statistics.median(bubbles):7.3f}" if c.name != "ddp" else f"{'-':>7s}"
            print(f"  {c.name:15s} {rank:4d} {step:7.2f} {ph['compute']:8.2f} {ph['p2p']:7.2f} "
                  f"{ph['sync']:7.2f} {ph['optimizer']:7.2f} {other:7.2f} {bubble}")
        if c.name != "ddp":
            worst = max(statistics.median(r["compute"] for r in rows) for rows in phases[c.name])
            optim = max(statistics.median(r["optimizer"] for r in rows)
                        for rows in phases[c.name])
            ideal = (worst * (m + s - 1) / m + optim) * 1e3
            print(f"  {'':15s} ideal (max compute x (M+S-1)/M + optimizer): {ideal:.2f} ms; "
                  f"measured step / ideal: "
                  f"{statistics.median(results.wall[c.name]) * 1e3 / ideal:.3f}")


def report_agreement(args, losses, diffs):
    """Losses of every step, as the global-batch mean, against DDP's; final weights too."""
    glob = {}
    for name, per_rank in losses.items():
        if name == "ddp":
            glob[name] = [sum(v) / len(v) for v in zip(*per_rank)]
        else:  # the last stage has them (our engine: every rank)
            glob[name] = per_rank[-1]
    ref = glob.get("ddp")
    for name, values in glob.items():
        line = (f"{name:15s} loss: first {values[0]:.6f}  last {values[-1]:.6f} "
                f"({len(values)} steps)")
        if ref is not None and name != "ddp":
            diff = max(abs(a - b) for a, b in zip(values, ref))
            line += f"; max |loss - ddp| {diff:.2e}"
            if name in diffs:
                line += f"; weights vs ddp at the end: max abs diff {max(diffs[name]):.2e}"
        print(line)


# ----------------------------------------------------------------------------- options, spawning
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds per contestant")
    p.add_argument("--steps", type=int, default=3, help="steps (global batches) per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per contestant first")
    p.add_argument("--micro_batches", type=int, default=4, help="M: micro-batches per step")
    p.add_argument("--micro_batch", type=int, default=8, help="sequences per micro-batch")
    p.add_argument("--n_layer", type=int, default=8)
    p.add_argument("--n_embd", type=int, default=128)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--block_size", type=int, default=64)
    p.add_argument("--vocab_size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1234, help="layer i's weights: seed + i")
    p.add_argument("--batches", type=int, default=16, help="distinct global batches, cycled")
    p.add_argument("--contestants", default=",".join(NAMES),
                   help=f"comma-separated, from {', '.join(NAMES)} (default all)")
    p.add_argument("--only", metavar="NAME", default=None, help="run this contestant alone")
    p.add_argument("--rss_each", action="store_true",
                   help="run each selected contestant alone, each in a fresh process pair")
    p.add_argument("--verbose", action="store_true", help="keep the engine's info logging")
    p.add_argument("--no_breakdown", dest="breakdown", action="store_false",
                   help="no per-phase timers (and so no bubble figures)")
    args = p.parse_args(argv)
    for name in ("threads", "rounds", "steps", "micro_batches", "micro_batch", "batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.micro_batches % STAGES:
        p.error(f"--micro_batches must be a multiple of {STAGES} (ddp splits the batch in halves)")
    names = [n.strip() for n in args.contestants.split(",") if n.strip()]
    for name in names + ([args.only] if args.only else []):
        if name not in CONTESTANTS:
            p.error(f"unknown contestant {name!r}; choose from {', '.join(NAMES)}")
    args.names = [args.only] if args.only else list(dict.fromkeys(names))
    return args


def main(argv=None):
    args = parse_args(argv)
    run_ranks(worker, args, STAGES)


if __name__ == "__main__":
    main()
