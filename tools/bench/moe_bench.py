"""Mixture of Experts (ep 2): an MoE layer's forward+backward against a dense MLP of the same
active parameter count, and its all-to-all bytes against the floor.

    python tools/bench/moe_bench.py                           # spawns 2 gloo ranks itself
    python tools/bench/moe_bench.py --tokens 512 1024 2048    # a sweep over tokens per rank
    python tools/bench/moe_bench.py --profile                 # + torch.profiler's top ops
    deepspeed --num_gpus 2 tools/bench/moe_bench.py           # or through the launcher

Contestants, in the same process pair, each rank with its own ``--tokens`` tokens of width
``--hidden`` (fp32, ``requires_grad`` like a hidden state inside a model):

- ``moe``: ``deepspeed.moe.layer.MoE(hidden, expert, num_experts=--experts, ep_size=2, k=--k)``
  with ``expert = Linear(H, 4H) -> GELU -> Linear(4H, H)``; each rank holds experts/2 of them,
  tokens cross ranks with ``all_to_all_single`` (one out, one back per forward; the same two in
  backward). Loss ``out.square().mean() + 0.01 * l_aux``, as a training step would;
- ``moe_local``: the same layer with ``ep_size=1`` (every rank holds every expert; no
  all-to-all, the same gating, dispatch and expert work per rank): ``moe / moe_local`` is the
  price of the exchange, ``moe_local / dense`` that of gating and dispatch;
- ``dense``: ``Linear(H, 4kH) -> GELU -> Linear(4kH, H)``, the same parameters a token
  activates in the MoE layer (one expert for k=1, two for k=2; the gate's ``H x E`` weights,
  0.2% of them at the defaults, are not matched). Loss ``out.square().mean()``.

A step is forward + backward of the layer alone (gradients set to None before it; no optimizer,
no gradient all-reduce, which both would pay alike). Timing is the method of
``engine_vs_ddp.py``: warm-up steps first; then ``--rounds`` rounds of ``--steps`` steps of each
contestant, the order flipping every round; a round's time is the slowest rank's; the headline
is the ratio of the medians over rounds, with the median of the per-round paired ratios and the
ratio of CPU time per step beside it. Tokens/s are per rank.

All-to-all bytes: ``deepspeed.comm.all_to_all_single`` is wrapped during one extra step of
``moe`` and counts the calls and the bytes of each input tensor (what a rank hands to the
exchange; ``(ep-1)/ep`` of it leaves the rank). The floor is what the tokens themselves weigh:
each of the two exchanges of one direction must carry ``k x tokens x hidden x dtype size``, so
``2 x k x tokens x hidden x dtype`` per direction; the capacity slots (``capacity_factor``,
``min_capacity``) are what the layer sends beyond it.

``--breakdown`` times the forward phases of ``moe`` (gate, experts, all-to-all; the rest is the
dispatch and combine einsums) and the all-to-all in backward. It is a tool, never a test:
nothing here asserts on time.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as tdist
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]
from engine_vs_ddp import run_ranks, slowest  # noqa: E402

NAMES = ("moe", "moe_local", "dense")
TARGET = 1.5
AUX_COEFF = 0.01


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    p.add_argument("--world_size", type=int, default=2, help="ranks to spawn when run directly")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--tokens", type=int, nargs="+", default=[1024],
                   help="tokens per rank per step; several values: a sweep (default 1024)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--experts", type=int, default=4, help="experts of the MoE layer (default 4)")
    p.add_argument("--ep_size", type=int, default=2)
    p.add_argument("--k", type=int, choices=(1, 2), default=1)
    p.add_argument("--capacity_factor", type=float, default=1.0)
    p.add_argument("--min_capacity", type=int, default=4)
    p.add_argument("--no_rts", action="store_true", help="use_rts=False (keep the first tokens)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--breakdown", action="store_true")
    p.add_argument("--profile", action="store_true",
                   help="torch.profiler over a few moe steps: rank 0 prints the top ops")
    args = p.parse_args(argv)
    for name in ("world_size", "threads", "hidden", "experts", "ep_size", "rounds", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if any(t < 1 for t in args.tokens):
        p.error(f"--tokens must be >= 1, got {args.tokens}")
    if args.experts % args.ep_size:
        p.error(f"--experts {args.experts} must be divisible by --ep_size {args.ep_size}")
    return args


# ----------------------------------------------------------------------------- contestants
def mlp(hidden, inner):
    return nn.Sequential(nn.Linear(hidden, inner), nn.GELU(), nn.Linear(inner, hidden))


class Contestant:
    def __init__(self, name, layer, is_moe):
        self.name, self.layer, self.is_moe = name, layer, is_moe
        self.params = list(layer.parameters())

    def step(self, x):
        for p in self.params:
            p.grad = None
        x.grad = None
        if self.is_moe:
            out, l_aux, _ = self.layer(x)
            loss = out.square().mean() + AUX_COEFF * l_aux
        else:
            loss = self.layer(x).square().mean()
        loss.backward()


def build(args, name):
    from deepspeed.moe.layer import MoE

    torch.manual_seed(0)
    expert = mlp(args.hidden, 4 * args.hidden)
    if name == "dense":
        return Contestant(name, mlp(args.hidden, 4 * args.k * args.hidden), False)
    layer = MoE(args.hidden, expert, num_experts=args.experts,
                ep_size=args.ep_size if name == "moe" else 1, k=args.k,
                capacity_factor=args.capacity_factor, min_capacity=args.min_capacity,
                use_rts=not args.no_rts)
    return Contestant(name, layer, True)


def active_params(c, args):
    """Parameters one token goes through (experts: k of them, plus the gate)."""
    if not c.is_moe:
        return sum(p.numel() for p in c.params)
    experts = c.layer.deepspeed_moe.experts.deepspeed_experts
    one = sum(p.numel() for p in experts[0].parameters())
    gate = sum(p.numel() for p in c.layer.deepspeed_moe.gate.parameters())
    return args.k * one, gate


# ----------------------------------------------------------------------------- counting
class A2ACounter:
    """Wraps ``deepspeed.comm.all_to_all_single`` (looked up at call time by the MoE layer):
    calls, input bytes, wall seconds, split by autograd direction."""

    def __init__(self):
        import deepspeed.comm as dscomm

        self.module, self.original = dscomm, dscomm.all_to_all_single
        self.calls = {"forward": [], "backward": []}
        self.seconds = {"forward": 0.0, "backward": 0.0}
        self.direction = "forward"

    def __enter__(self):
        original = self.original

        def counted(output, input, *a, **kw):
            start = time.perf_counter()
            try:
                return original(output, input, *a, **kw)
            finally:
                self.seconds[self.direction] += time.perf_counter() - start
                self.calls[self.direction].append(input.numel() * input.element_size())

        self.module.all_to_all_single = counted
        return self

    def __exit__(self, *exc):
        self.module.all_to_all_single = self.original

    def reset(self):
        self.calls = {"forward": [], "backward": []}
        self.seconds = {"forward": 0.0, "backward": 0.0}


class ForwardPhases:
    """Wall time of the gate's and the experts' forward (forward hooks)."""

    def __init__(self, layer):
        self.totals = {"gate": 0.0, "experts": 0.0}
        self._start = {}
        moe = layer.deepspeed_moe
        for name, module in (("gate", moe.gate), ("experts", moe.experts)):
            module.register_forward_pre_hook(self._pre(name))
            module.register_forward_hook(self._post(name))

    def _pre(self, name):
        def hook(*_):
            self._start[name] = time.perf_counter()
        return hook

    def _post(self, name):
        def hook(*_):
            self.totals[name] += time.perf_counter() - self._start[name]
        return hook

    def reset(self):
        self.totals = dict.fromkeys(self.totals, 0.0)


def run_block(c, x, steps):
    tdist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(steps):
        c.step(x)
    return slowest(time.perf_counter() - start), slowest(time.process_time() - cpu_start)


def count_bytes(c, x):
    with A2ACounter() as counter:
        out, l_aux, _ = c.layer(x)
        counter.direction = "backward"
        (out.square().mean() + AUX_COEFF * l_aux).backward()
    return counter.calls


def breakdown(args, c, x):
    """Per-step medians (slowest rank) of forward, its phases, backward and its all-to-all."""
    phases = ForwardPhases(c.layer)
    rows = []
    with A2ACounter() as counter:
        for _ in range(args.rounds):
            phases.reset()
            counter.reset()
            counter.direction = "forward"
            for p in c.params:
                p.grad = None
            tdist.barrier()
            t0 = time.perf_counter()
            out, l_aux, _ = c.layer(x)
            loss = out.square().mean() + AUX_COEFF * l_aux
            t1 = time.perf_counter()
            counter.direction = "backward"
            loss.backward()
            t2 = time.perf_counter()
            fwd = t1 - t0
            row = {"forward": fwd, "gate": phases.totals["gate"],
                   "experts": phases.totals["experts"], "a2a fwd": counter.seconds["forward"],
                   "backward": t2 - t1, "a2a bwd": counter.seconds["backward"]}
            row["dispatch+combine"] = fwd - row["gate"] - row["experts"] - row["a2a fwd"]
            rows.append({k: slowest(v) for k, v in row.items()})
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def profile(c, x, rank):
    from torch.profiler import ProfilerActivity, profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            c.step(x)
    if rank == 0:
        print("torch.profiler, moe, 5 steps, rank 0, by self CPU time:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
    tdist.barrier()


# ----------------------------------------------------------------------------- one rank
def measure(args, tokens, rank):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(tokens, args.hidden, generator=g).requires_grad_(True)
    contestants = [build(args, n) for n in NAMES]
    for c in contestants:
        run_block(c, x, args.warmup)
    wall = {c.name: [] for c in contestants}
    cpu = {c.name: [] for c in contestants}
    for r in range(args.rounds):
        for c in (contestants if r % 2 == 0 else contestants[::-1]):
            w, t = run_block(c, x, args.steps)
            wall[c.name].append(w / args.steps)
            cpu[c.name].append(t / args.steps)
    moe = contestants[0]
    calls = count_bytes(moe, x)
    phases = breakdown(args, moe, x) if args.breakdown else None
    if args.profile:
        profile(moe, x, rank)
    return contestants, wall, cpu, calls, phases


def report(args, tokens, world, contestants, wall, cpu, calls, phases):
    med = {n: statistics.median(v) for n, v in wall.items()}
    cpu_med = {n: statistics.median(v) for n, v in cpu.items()}
    moe, local, dense = contestants
    experts_active, gate = active_params(moe, args)
    print(f"\n== tokens per rank {tokens}, hidden {args.hidden}, {args.experts} experts over "
          f"ep_size {args.ep_size} ({moe.layer.num_local_experts} per rank), top-{args.k}, "
          f"capacity factor {args.capacity_factor}, {world} gloo ranks x {args.threads} "
          f"thread(s), torch {torch.__version__}")
    print(f"active parameters per token: MoE {experts_active:,} (+ gate {gate:,}), dense "
          f"{active_params(dense, args):,}; rounds {args.rounds} x {args.steps} steps, "
          f"{args.warmup} warm-up")
    for c in contestants:
        ms = sorted(t * 1e3 for t in wall[c.name])
        print(f"  {c.name:9s} fwd+bwd ms: median {statistics.median(ms):8.2f}  min {ms[0]:8.2f}"
              f"  max {ms[-1]:8.2f}  CPU {cpu_med[c.name] * 1e3:8.2f}  tokens/s per rank "
              f"{tokens / med[c.name]:10,.0f}")
    for a, b in (("moe", "dense"), ("moe_local", "dense"), ("moe", "moe_local")):
        paired = statistics.median(x / y for x, y in zip(wall[a], wall[b]))
        print(f"  {a}/{b}: {med[a] / med[b]:.2f} (medians), paired {paired:.3f}, CPU-time "
              f"{cpu_med[a] / cpu_med[b]:.3f}")
    dtype_size = 4
    floor = 2 * args.k * tokens * args.hidden * dtype_size
    for direction in ("forward", "backward"):
        sent = calls[direction]
        total = sum(sent)
        print(f"  all-to-all {direction:8s}: {len(sent)} calls, {total:,} B in "
              f"({[f'{b:,}' for b in sent]}), floor {floor:,} B, ratio {total / floor:.3f}; "
              f"leaving the rank {total * (args.ep_size - 1) // args.ep_size:,} B")
    if phases:
        print("  moe phases, median ms per step (slowest rank): " + ", ".join(
            f"{k} {v * 1e3:.2f}" for k, v in phases.items()))
    ratio = med["moe"] / med["dense"]
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"moe/dense fwd+bwd time ratio: {ratio:.2f} (target <= {TARGET}: {verdict})",
          flush=True)


def worker(args):
    torch.set_num_threads(args.threads)
    import deepspeed
    from deepspeed import comm as dist

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.ep_size:
        raise SystemExit(f"--ep_size {args.ep_size} must divide the world size {world}")
    for tokens in args.tokens:
        results = measure(args, tokens, rank)
        if rank == 0:
            report(args, tokens, world, *results)
    tdist.barrier()
    tdist.destroy_process_group()


def main(argv=None):
    args = parse_args(argv)
    run_ranks(worker, args, args.world_size)


if __name__ == "__main__":
    main()
