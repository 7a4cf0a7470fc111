"""Step time, memory and ZeRO state of ZeRO stages 0-3 (and stage 2 + CPU offload) against DDP and FSDP2.

    python tools/bench/zero_bench.py [--rounds 40 --steps 5 --breakdown ...]
    python tools/bench/zero_bench.py --n_layer 4 --n_embd 256        # a larger GPT
    python tools/bench/zero_bench.py --rss_each --rounds 2           # peak RSS, one run each
    python tools/bench/zero_bench.py --only stage2 --rounds 2        # one contestant alone

The timing method is ``engine_vs_ddp.py``'s (whose options it shares): all contestants live in one
process pair and take turns, ``--steps`` steps each per round, the order flipping every round;
the figure is the median over rounds of the slowest rank's mean step time, and every ratio is
against DDP measured in the same run. All start from the same weights and see the same batches,
so the tool checks that their parameters agree with DDP's at the end (ZeRO with torch's AdamW
does DDP's math; the offload contestant steps DeepSpeedCPUAdam, which rounds differently).

Peak RSS (``ru_maxrss``) is a process's high-water mark, so in the shared run it is one figure
for all contestants; ``--only NAME`` runs one contestant alone, and ``--rss_each`` runs every
selected contestant alone in its own fresh process pair, one after the other, to give each
its own peak. It is a tool, never a test: nothing here asserts on time or memory.
"""
import os
import resource
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as tdist

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "examples"), str(HERE)]
from contestants import CONTESTANTS, Phases  # noqa: E402
from engine_vs_ddp import (build_parser, check_args, max_abs_difference, measure,  # noqa: E402
                           report_rounds, run_ranks, start_worker)

DEFAULT = "DDP,stage0,stage1,stage2,stage2_overlap,stage2_offload"
REFERENCE = "DDP"
PHASES = Phases.NAMES + ("allgather",)


def parse_args(argv=None):
    p = build_parser(__doc__.splitlines()[0])
    p.add_argument("--contestants", default=DEFAULT,
                   help=f"comma-separated, from {', '.join(CONTESTANTS)} (default {DEFAULT}); "
                        f"{REFERENCE} is added when missing, every ratio is against it")
    p.add_argument("--reduce_bucket_size", type=int, default=None,
                   help="zero_optimization.reduce_bucket_size (elements) for the ZeRO "
                        "contestants; default: the config's own (5e8, one bucket for these GPTs)")
    p.add_argument("--only", metavar="NAME", default=None,
                   help="run this one contestant alone (its own peak RSS; no ratios)")
    p.add_argument("--rss_each", action="store_true",
                   help="run each selected contestant alone, in turn, each in a fresh process "
                        "pair: one peak RSS per contestant")
    args = check_args(p, p.parse_args(argv))
    if args.reduce_bucket_size is not None and args.reduce_bucket_size < 1:
        p.error(f"--reduce_bucket_size must be >= 1, got {args.reduce_bucket_size}")
    names = [n.strip() for n in args.contestants.split(",") if n.strip()]
    for name in names + ([args.only] if args.only else []):
        if name not in CONTESTANTS:
            p.error(f"unknown contestant {name!r}; choose from {', '.join(CONTESTANTS)}")
    if REFERENCE not in names:
        names.insert(0, REFERENCE)
    args.names = [args.only] if args.only else list(dict.fromkeys(names))
    return args


def peak_rss_mib():
    """This process's peak resident set size so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def report_rss(before, after, alone):
    """Each rank's peak RSS before the contestants were built and at the end; ``alone``: one
    contestant had the process pair to itself, so the peak is its own."""
    print("peak RSS MiB per rank: before the contestants "
          + ", ".join(f"{v:.0f}" for v in before) + "; at the end "
          + ", ".join(f"{v:.0f}" for v in after)
          + ("" if alone else
             "  (one process pair for all contestants: one shared peak; --rss_each for each)"))


def gathered(value):
    """``value`` from every rank, in rank order."""
    out = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, value)
    return out


# ----------------------------------------------------------------------------- one rank
def worker(args):
    rank, world, model_cfg, batches = start_worker(args)
    rss_before = gathered(peak_rss_mib())
    contestants = [CONTESTANTS[n](args, model_cfg) for n in args.names]
    results = measure(args, contestants, batches)
    rss_after = gathered(peak_rss_mib())
    state = {c.name: gathered(c.state_bytes()) for c in contestants}
    # every rank takes part: ZeRO-3 and FSDP2 gather their full parameters collectively
    final = {c.name: c.parameters() for c in contestants}
    if rank == 0:
        params = final[contestants[0].name]
        print(f"GPT {sum(p.numel() for p in params):,} params (n_layer={model_cfg.n_layer}, "
              f"n_embd={model_cfg.n_embd}, seq={model_cfg.block_size}), micro batch "
              f"{args.micro_batch}, {world} gloo ranks x {args.threads} thread(s), "
              f"torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}")
        for c in contestants:
            print(f"  {c.name:16s} optimizer: {getattr(c, 'optimizer_name', 'torch.optim.AdamW')}")
        report_rounds(args)
        report_times(args, results, contestants)
        report_state(state, world)
        report_rss(rss_before, rss_after, alone=len(contestants) == 1)
        if not args.only:
            report_agreement(args, final)
    for c in contestants:
        c.destroy()
    tdist.barrier()
    tdist.destroy_process_group()


def report_times(args, results, contestants):
    names = [c.name for c in contestants]
    ref = names[0] if args.only else REFERENCE
    ref_ms = results.median_ms(results.wall, ref)
    ref_cpu = results.median_ms(results.cpu, ref)
    print(f"  {'contestant':16s} {'median ms':>9s} {'min':>7s} {'max':>7s} {'CPU ms':>7s}"
          + ("" if args.only else f" {'/DDP':>6s} {'paired':>7s} {'CPU/DDP':>7s}"))
    for name in names:
        ms = sorted(t * 1e3 for t in results.wall[name])
        med, cpu = statistics.median(ms), results.median_ms(results.cpu, name)
        line = f"  {name:16s} {med:9.2f} {ms[0]:7.2f} {ms[-1]:7.2f} {cpu:7.2f}"
        if not args.only:
            paired = statistics.median(a / b for a, b in zip(results.wall[name],
                                                             results.wall[ref]))
            line += f" {med / ref_ms:6.3f} {paired:7.3f} {cpu / ref_cpu:7.3f}"
        print(line)
    if args.breakdown:
        print("  per-phase median ms:  " + "  ".join(f"{n:>9s}" for n in PHASES))
        for name in names:
            row = [statistics.median(p.get(n, 0.0) for p in results.phases[name]) * 1e3
                   for n in PHASES]
            print(f"    {name:16s}     " + "  ".join(f"{v:9.3f}" for v in row))


def report_state(state, world):
    """Per-rank bytes of fp32 master weights, optimizer state and fp32 gradient partition."""
    print("per-rank fp32 state KiB (master + optimizer state [+ grad partition]), rank 0..:")
    for name, per_rank in state.items():
        cells = [f"{m / 1024:.1f} + {o / 1024:.1f}" + (f" [+ {g / 1024:.1f}]" if g else "")
                 + f" = {(m + o) / 1024:.1f}" for m, o, g in per_rank]
        print(f"  {name:16s} " + " | ".join(cells))


def report_agreement(args, final):
    """``final``: each contestant's full parameters after the run, by name."""
    steps = args.warmup + args.rounds * args.steps
    ref = final[REFERENCE]
    for name, mine in final.items():
        if name == REFERENCE:
            continue
        close = all(torch.allclose(p, q, rtol=1e-4, atol=1e-6) for p, q in zip(mine, ref))
        print(f"{name} vs DDP parameters after {steps} steps: allclose {close}, "
              f"max abs diff {max_abs_difference(mine, ref):.2e}")


# ----------------------------------------------------------------------------- start
def main(argv=None):
    args = parse_args(argv)
    run_ranks(worker, args, args.world_size)


if __name__ == "__main__":
    main()
