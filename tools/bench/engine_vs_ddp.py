"""Step time of our engine (ZeRO stage 0) against plain PyTorch DDP on the same GPT, same data.

    python tools/bench/engine_vs_ddp.py [--rounds 40 --steps 5 --with_flat --breakdown ...]
    deepspeed --num_gpus 2 tools/bench/engine_vs_ddp.py [...]

Run directly, it spawns ``--world_size`` gloo ranks itself (torch.multiprocessing); under a
launcher (``RANK`` set) it is one of the ranks. The contestants (see ``contestants.py``) live in
the same process pair and take turns: each round times ``--steps`` steps of each, the order
flipping every round, so a noisy neighbour on a shared machine slows all of them alike. Warm-up steps are not
timed. The figure is the median over rounds of the mean step time (the slowest rank's, since a
data-parallel step is as slow as its slowest rank).

Both start from the same weights and see the same batches in the same order, so after the same
number of steps their parameters must agree to rounding: the script prints whether they do,
which is the check that the timed engine does the same math as DDP.

``--with_flat`` adds the engine's algorithm hand-written without the engine (separating engine
overhead from reduction strategy); ``--breakdown`` adds a per-phase table (forward / backward /
all-reduce / grad-norm / optimizer) to find where a difference comes from. It is a tool, never a test: nothing here asserts on time.
"""
import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as tdist

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "examples"), str(HERE)]
from contestants import CONTESTANTS, Phases  # noqa: E402
from gpt import GPTConfig, MarkovTokens  # noqa: E402  (the demo's model and data)


def build_parser(description=__doc__.splitlines()[0]):
    """The options every contestant run shares (``zero_bench.py`` adds its own to these)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    p.add_argument("--world_size", type=int, default=2, help="ranks to spawn when run directly")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--rounds", type=int, default=40, help="timed rounds per contestant")
    p.add_argument("--steps", type=int, default=5, help="steps per round")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per contestant first")
    p.add_argument("--micro_batch", type=int, default=16)
    p.add_argument("--n_layer", type=int, default=2)
    p.add_argument("--n_embd", type=int, default=64)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--block_size", type=int, default=32)
    p.add_argument("--vocab_size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--engine_optimizer", choices=("torch", "config"), default="torch",
                   help="torch (default): the engine's config asks for torch's AdamW "
                        "(torch_adam: true), the same optimizer as DDP, so the ratio measures the "
                        "engine alone and the weights must match; config: the AdamW the engine "
                        "picks by itself (DeepSpeedCPUAdam on a CPU), what a user gets")
    p.add_argument("--with_flat", action="store_true",
                   help="add a third contestant: the engine's flat all-reduce written by hand, "
                        "to split engine-vs-DDP into engine overhead and reduction strategy")
    p.add_argument("--breakdown", action="store_true",
                   help="also time each phase of the step (adds a few timer calls per step)")
    return p


def check_args(p, args):
    """Reject counts that make no sense, through ``p.error`` (exit 2 with the usage line)."""
    for name in ("world_size", "threads", "rounds", "steps", "micro_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    return args


def parse_args(argv=None):
    p = build_parser()
    return check_args(p, p.parse_args(argv))


# ----------------------------------------------------------------------------- one rank
def shard_batches(args, model_cfg, rank, world):
    """This rank's micro-batches, built once so data loading is timed for neither contestant."""
    data = MarkovTokens(samples=args.micro_batch * world * 64, seq_len=model_cfg.block_size,
                        vocab_size=model_cfg.vocab_size, seed=1234)
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=world, rank=rank,
                                                  shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=args.micro_batch, sampler=sampler)
    return list(loader)


def slowest(seconds):
    """The largest of every rank's ``seconds``: a data-parallel step ends with its slowest rank."""
    t = torch.tensor([seconds], dtype=torch.float64)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return t.item()


def run_block(contestant, batches, cursor, steps):
    """(wall seconds, CPU seconds) of ``steps`` steps, each the slowest rank's."""
    tdist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(steps):
        x, y = batches[(cursor + i) % len(batches)]
        contestant.step(x, y)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return slowest(wall), slowest(cpu)


def max_abs_difference(a, b):
    return max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(a, b))


class Results:
    """Per-round figures of each contestant, gathered on every rank (rank 0 prints them)."""

    def __init__(self, names):
        self.wall = {n: [] for n in names}
        self.cpu = {n: [] for n in names}
        self.phases = {n: [] for n in names}

    def median_ms(self, table, name):
        return statistics.median(table[name]) * 1e3


def measure(args, contestants, batches):
    """Warm up each contestant, then ``args.rounds`` rounds taking turns, the order flipping
    every round. All contestants step through the same batches in the same order."""
    for c in contestants:
        run_block(c, batches, 0, args.warmup)
        if args.breakdown:
            c.instrument(Phases())
    results = Results([c.name for c in contestants])
    cursor = args.warmup
    for r in range(args.rounds):
        for c in (contestants if r % 2 == 0 else contestants[::-1]):
            if args.breakdown:
                c.phases.reset()
            wall, cpu = run_block(c, batches, cursor, args.steps)
            results.wall[c.name].append(wall / args.steps)
            results.cpu[c.name].append(cpu / args.steps)
            if args.breakdown:
                results.phases[c.name].append({k: slowest(v) / args.steps
                                               for k, v in c.phases.totals.items()})
        cursor += args.steps
    return results


def start_worker(args):
    """One benchmark rank's start-up: threads, gloo, the model config and this rank's batches.
    Returns (rank, world size, model config, batches)."""
    torch.set_num_threads(args.threads)
    import deepspeed
    from deepspeed import comm as dist

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model_cfg = GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size,
                          n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd)
    return rank, world, model_cfg, shard_batches(args, model_cfg, rank, world)


def worker(args):
    rank, world, model_cfg, batches = start_worker(args)
    names = ["engine", "DDP"] + (["flat"] if args.with_flat else [])
    contestants = [CONTESTANTS[n](args, model_cfg) for n in names]
    engine = contestants[0]
    results = measure(args, contestants, batches)
    a = engine.parameters()
    if rank == 0:
        print(f"GPT {sum(p.numel() for p in a):,} params (n_layer={model_cfg.n_layer}, "
              f"n_embd={model_cfg.n_embd}, seq={model_cfg.block_size}), micro batch "
              f"{args.micro_batch}, {world} gloo ranks x {args.threads} thread(s), "
              f"torch {torch.__version__}")
        print(f"engine optimizer: {engine.optimizer_name}; DDP optimizer: torch.optim.AdamW")
        report(args, results, names)
        steps = args.warmup + args.rounds * args.steps
        for other in contestants[1:]:
            b = other.parameters()
            close = all(torch.allclose(p, q, rtol=1e-4, atol=1e-6) for p, q in zip(a, b))
            print(f"engine and {other.name} parameters allclose after {steps} steps: {close} "
                  f"(max abs diff {max_abs_difference(a, b):.2e})")
        if args.engine_optimizer == "config":
            print("  (the engine steps a different AdamW kernel here: it rounds differently and "
                  "Adam amplifies that where gradients are near zero, so bitwise equality is "
                  "not expected; --engine_optimizer torch checks the math)")
        eng, ref = results.median_ms(results.wall, "engine"), results.median_ms(results.wall, "DDP")
        print(f"engine/DDP step-time ratio: {eng / ref:.2f} (engine {eng:.2f} ms, "
              f"DDP {ref:.2f} ms, median of {args.rounds} rounds)", flush=True)
    engine.engine.destroy()
    tdist.barrier()
    tdist.destroy_process_group()


def report_rounds(args):
    print(f"rounds: {args.rounds} x {args.steps} timed steps per contestant, "
          f"{args.warmup} warm-up steps first")


def report(args, results, names):
    report_rounds(args)
    for name in names:
        ms = sorted(t * 1e3 for t in results.wall[name])
        print(f"  {name:6s} step ms: median {statistics.median(ms):.2f}  min {ms[0]:.2f}  "
              f"max {ms[-1]:.2f}  (CPU time per step: median "
              f"{results.median_ms(results.cpu, name):.2f})")
    if args.breakdown:
        print("  per-phase median ms:  " + "  ".join(f"{n:>9s}" for n in Phases.NAMES))
        for name in names:
            row = [statistics.median(p[n] for p in results.phases[name]) * 1e3
                   for n in Phases.NAMES]
            print(f"    {name:6s}              " + "  ".join(f"{v:9.3f}" for v in row))
    paired = statistics.median(e / d for e, d in zip(results.wall["engine"], results.wall["DDP"]))
    cpu_ratio = results.median_ms(results.cpu, "engine") / results.median_ms(results.cpu, "DDP")
    print(f"paired per-round ratio (median): {paired:.3f}; CPU-time ratio: {cpu_ratio:.3f} "
          f"(CPU time is less sensitive to other load on the machine)")
    if "flat" in names:
        for a, b in (("engine", "flat"), ("flat", "DDP")):
            ratio = statistics.median(x / y for x, y in zip(results.wall[a], results.wall[b]))
            print(f"  paired ratio {a}/{b}: {ratio:.3f}")


# ----------------------------------------------------------------------------- spawning
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(local_rank, worker, args, world_size, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local_rank),
                      LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size))
    worker(args)


def spawn(worker, args, world_size):
    """``worker(args)`` on ``world_size`` fresh local processes, one gloo rank each."""
    torch.multiprocessing.spawn(_spawned, args=(worker, args, world_size, _free_port()),
                                nprocs=world_size, join=True)


def run_ranks(worker, args, world_size):
    """Every bench's start: under a launcher (``RANK`` set) this process is one rank and runs
    ``worker(args)``; run directly, it spawns ``world_size`` ranks (``OMP_NUM_THREADS`` set to
    ``--threads``). With ``--rss_each`` (``zero_bench.py``, ``pipe_bench.py``) each contestant
    of ``args.names`` runs alone in its own fresh ranks, one after the other, so that each
    process's peak RSS is that contestant's."""
    rss_each = getattr(args, "rss_each", False)
    if "RANK" in os.environ:
        if rss_each:
            raise SystemExit("--rss_each spawns its own process pairs; run it directly, not "
                             "under a launcher (use --only NAME there)")
        worker(args)
        return
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if not rss_each:
        spawn(worker, args, world_size)
        return
    for name in list(args.names):
        print(f"=== {name} alone", flush=True)
        args.only, args.names = name, [name]
        spawn(worker, args, world_size)


def main(argv=None):
    args = parse_args(argv)
    run_ranks(worker, args, args.world_size)


if __name__ == "__main__":
    main()
