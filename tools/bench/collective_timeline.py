"""Each collective of a training step, on every rank: how long it took and how far apart the
ranks reached it.

    python tools/bench/collective_timeline.py                            # demo GPT, ZeRO-3
    python tools/bench/collective_timeline.py --only stage2_overlap --n_layer 4 --n_embd 256 \\
        --micro_batch 8 --block_size 128 --steps 10

A collective is a sync point: the rank that arrives first waits for the last. This tool splits
what a step pays at each one into *skew* (how much later the last rank started it) and the
collective's own time (the last rank's launch to completion), which a bench's per-phase
breakdown cannot: it sees only the sum on the slowest rank. It registers a ``deepspeed.comm``
observer, whose records carry launch-to-completion latency (for an async op: to its ``wait``),
so the split is exact for synchronous collectives and an upper bound for asynchronous ones.
Rank clocks are the same machine's ``time.time()``. Options and contestants are
``zero_bench.py``'s (``--only NAME``, default stage3_overlap). A tool, not a test.
"""
import statistics
import sys
import time
from pathlib import Path

import torch.distributed as tdist

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "examples"), str(HERE)]
from contestants import CONTESTANTS  # noqa: E402
from engine_vs_ddp import run_block, run_ranks, start_worker  # noqa: E402
from zero_bench import parse_args as zero_bench_args  # noqa: E402


def parse_args(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    steps = 20
    if "--steps" in argv:  # zero_bench's --steps is per round; here it is the traced steps
        at = argv.index("--steps")
        steps = int(argv[at + 1])
        del argv[at:at + 2]
    if "--only" not in argv:
        argv += ["--only", "stage3_overlap"]
    args = zero_bench_args(argv)
    args.traced_steps = steps
    return args


def worker(args):
    from deepspeed import comm as dist

    rank, world, model_cfg, batches = start_worker(args)
    contestant = CONTESTANTS[args.only](args, model_cfg)
    run_block(contestant, batches, 0, args.warmup)
    records = []

    def observe(record):
        records.append((record.op, record.async_op, time.time(), record.latency_s))

    dist.add_comm_observer(observe)
    run_block(contestant, batches, args.warmup, args.traced_steps)
    dist.remove_comm_observer(observe)
    every = [None] * world
    tdist.all_gather_object(every, records)
    if rank == 0:
        report(args, every, world)
    contestant.destroy()
    tdist.barrier()
    tdist.destroy_process_group()


def report(args, every, world):
    count = min(len(r) for r in every)
    if any(len(r) != count for r in every):
        print(f"ranks recorded different numbers of collectives: {[len(r) for r in every]}; "
              f"comparing the first {count}")
    by_op = {}
    for i in range(count):
        op, async_op = every[0][i][0], every[0][i][1]
        starts = [r[i][2] - r[i][3] for r in every]
        last = max(range(world), key=lambda k: starts[k])
        entry = by_op.setdefault((op, async_op), {"skew": [], "own": [], "latency": []})
        entry["skew"].append(starts[last] - min(starts))
        entry["own"].append(every[last][i][3])
        entry["latency"].append(max(r[i][3] for r in every))
    print(f"{args.only}, {world} gloo ranks, {args.traced_steps} steps after {args.warmup} "
          f"warm-up; ms per collective, median [90th percentile]:")
    print(f"  {'collective':28s} {'per step':>8s} {'slowest rank':>20s} {'skew':>20s} "
          f"{'last rank own':>20s}")

    def cell(values):
        values = sorted(v * 1e3 for v in values)
        return f"{statistics.median(values):8.3f} [{values[int(0.9 * (len(values) - 1))]:8.3f}]"

    for (op, async_op), entry in by_op.items():
        name = op + (" (async)" if async_op else "")
        print(f"  {name:28s} {len(entry['own']) / args.traced_steps:8.1f} "
              f"{cell(entry['latency']):>20s} {cell(entry['skew']):>20s} {cell(entry['own']):>20s}")


def main(argv=None):
    args = parse_args(argv)
    run_ranks(worker, args, args.world_size)


if __name__ == "__main__":
    main()
