"""gloo's reduce-scatter and all-gather, each route ``deepspeed.comm`` could take, in isolation.

    python tools/bench/gloo_collectives_bench.py [--sizes 131072,786432,3200512 --reps 30]

The figures behind ``core/comm/backend_ops.py``'s choice of route on gloo (see the comment at
``EXCHANGE_FOR_REDUCE_SCATTER``). Every rank runs each route on the same tensors, a barrier
before each run, the routes taking turns in an order that flips every repetition; the figure is
the median over repetitions of the slowest rank's time. Sizes are the whole (gathered, or
to-be-scattered) tensor in fp32 elements. Reduce-scatter routes:

    native      torch's reduce_scatter_tensor on gloo
    all_reduce  an all-reduce of a copy of the input, keeping one's piece (the route for pieces
                under ``EXCHANGE_MIN_PIECE_BYTES``, and for MAX/MIN/PRODUCT)
    exchange    point-to-point: each rank sends rank r its piece and sums what it receives
                (the route for larger pieces)

All-gather routes: ``native`` (torch's all_gather_into_tensor) and ``exchange`` (isend/irecv
of one's shard to every other rank; not used by deepspeed.comm, see the same comment).
In isolation is not inside a training step: ``collective_timeline.py`` measures those. A tool,
not a test: nothing here asserts on time.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as tdist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_vs_ddp import run_ranks  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="131072,786432,3200512",
                   help="comma-separated whole-tensor sizes in fp32 elements")
    p.add_argument("--reps", type=int, default=30, help="timed repetitions per route and size")
    p.add_argument("--world_size", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    return args


def _routes(n, rank, world):
    from deepspeed.comm import backend_ops

    piece = n // world
    send = torch.randn(piece)
    gathered = torch.empty(piece * world)
    given = torch.randn(piece * world)
    scratch = given.clone()  # reduced in place run after run: the values grow, the time not
    out = torch.empty(piece)
    SUM = tdist.ReduceOp.SUM

    def exchange_gather():
        works = []
        for peer in range(world):
            if peer != rank:
                works.append(tdist.irecv(gathered.narrow(0, peer * piece, piece), peer, tag=7))
                works.append(tdist.isend(send, peer, tag=7))
        gathered.narrow(0, rank * piece, piece).copy_(send)
        for work in works:
            work.wait()

    def all_reduce_route():  # as the reducer calls it: its bucket is scratch, no copy
        backend_ops._reduce_scatter_by_all_reduce(out, scratch, SUM, None, False, True)

    return {
        "reduce_scatter native": lambda: tdist.reduce_scatter_tensor(out, given),
        "reduce_scatter all_reduce": all_reduce_route,
        "reduce_scatter exchange":
            lambda: backend_ops._reduce_scatter_by_exchange(out, given, SUM, None, False),
        "all_gather native": lambda: tdist.all_gather_into_tensor(gathered, send),
        "all_gather exchange": exchange_gather,
    }


def worker(args):
    import deepspeed

    torch.set_num_threads(args.threads)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = tdist.get_rank(), tdist.get_world_size()
    for n in args.sizes:
        routes = _routes(n, rank, world)
        names = list(routes)
        times = {name: [] for name in names}
        for rep in range(args.reps + 2):  # two untimed warm-up repetitions
            for name in (names if rep % 2 == 0 else names[::-1]):
                tdist.barrier()
                start = time.perf_counter()
                routes[name]()
                elapsed = time.perf_counter() - start
                slowest = torch.tensor([elapsed])
                tdist.all_reduce(slowest, op=tdist.ReduceOp.MAX)
                if rep >= 2:
                    times[name].append(slowest.item())
        if rank == 0:
            print(f"{n:,} fp32 elements, {world} gloo ranks x {args.threads} thread(s), "
                  f"median of {args.reps} (slowest rank):")
            for name in names:
                print(f"  {name:28s} {statistics.median(times[name]) * 1e3:8.3f} ms")
    tdist.destroy_process_group()


def main(argv=None):
    args = parse_args(argv)
    run_ranks(worker, args, args.world_size)  # spawns ranks, or is one under a launcher


if __name__ == "__main__":
    main()
