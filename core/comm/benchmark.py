"""``ds_bench``: latency and bandwidth of the collectives, measured through ``deepspeed.comm``.

    deepspeed --num_gpus 2 $(which ds_bench) --scan --all-reduce
    torchrun --nproc_per_node 2 $(which ds_bench) --all-gather --maxsize 20

Each selected op (``--all-reduce``, ``--all-gather``, ``--all-to-all``, ``--broadcast``,
``--pt2pt``; none selected means all) runs ``--warmups`` untimed then ``--trials`` timed calls per
message size. ``--scan`` sweeps 2**1 .. 2**(maxsize-1) elements; without it one size is measured:
2**(maxsize-1) elements, halved until the op's buffers fit in ``--mem-factor`` of the free
device memory. The duration of a size is the slowest rank's mean, and rank 0 prints one row per
size: message size, latency, algorithm bandwidth (bytes moved per rank / time) and bus bandwidth
(algbw times the op's share of data that crosses links: 2(n-1)/n for all-reduce, (n-1)/n for
all-gather and all-to-all, 1 for broadcast and point-to-point), as NCCL's tests define them.
After timing, each size is checked once with known inputs, so a number is never reported for a
collective that returned wrong data.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

OPS = ("all_reduce", "all_gather", "all_to_all", "broadcast", "pt2pt")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "all_to_all": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
              "pt2pt": lambda n: 1.0}
BUFFERS = {"all_reduce": lambda n: 1, "all_gather": lambda n: 1 + n, "all_to_all": lambda n: 2,
           "broadcast": lambda n: 1, "pt2pt": lambda n: 1}  # message-sized buffers per rank


@dataclass
class Row:
    op: str
    elements: int
    nbytes: int  # bytes of the op's message per rank (all-gather: the gathered output)
    seconds: float  # the slowest rank's mean per call
    algbw: float  # bytes per second
    busbw: float

    def bandwidths(self, unit):
        scale = 8 / 1e9 if unit == "Gbps" else 1 / 1e9
        return self.algbw * scale, self.busbw * scale


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="ds_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--local_rank", type=int, default=None, help="set by the launcher (ignored)")
    parser.add_argument("--trials", type=int, default=50, help="timed calls per size")
    parser.add_argument("--warmups", type=int, default=5, help="untimed calls per size")
    parser.add_argument("--maxsize", type=int, default=24,
                        help="sizes go up to 2**(maxsize-1) elements")
    parser.add_argument("--async-op", action="store_true", help="issue the trials async, then wait")
    parser.add_argument("--bw-unit", choices=("Gbps", "GBps"), default="Gbps")
    parser.add_argument("--backend", default=None,
                        help="torch.distributed backend (default: the accelerator's, gloo on CPU)")
    parser.add_argument("--dist", choices=("deepspeed", "torch"), default="deepspeed",
                        help="call deepspeed.comm or torch.distributed directly")
    parser.add_argument("--scan", action="store_true", help="sweep message sizes")
    parser.add_argument("--raw", action="store_true", help="plain numbers (bytes, us, unit/s)")
    parser.add_argument("--dtype", default="float", help="torch dtype name (float, half, bfloat16)")
    parser.add_argument("--mem-factor", type=float, default=0.3,
                        help="share of free device memory one size may use without --scan")
    parser.add_argument("--debug", action="store_true", help="every rank prints its own timings")
    for op in OPS:
        parser.add_argument(f"--{op.replace('_', '-')}", dest=op, action="store_true",
                            help=f"benchmark {op}")
    args = parser.parse_args(argv)
    for name in ("trials", "maxsize"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmups < 0 or not 0 < args.mem_factor <= 1:
        parser.error("--warmups must be >= 0 and --mem-factor in (0, 1]")
    args.torch_dtype = _dtype(parser, args.dtype)
    return args


def _dtype(parser, name):
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        parser.error(f"--dtype {name!r} is not a torch dtype (float, half, bfloat16, ...)")
    return dtype


def selected_ops(args):
    return [op for op in OPS if getattr(args, op)] or list(OPS)


def _comm(args):
    if args.dist == "torch":
        import torch.distributed as comm
    else:
        import deepspeed.comm as comm
    return comm


class _Case:
    """The buffers and the call of one op at one size on this rank."""

    def __init__(self, comm, op, elements, dtype, device, world, rank):
        import torch

        self.comm, self.op, self.world, self.rank = comm, op, world, rank
        if op == "all_to_all":
            elements = max(world, elements - elements % world)
        self.elements = elements
        self.input = torch.empty(elements, dtype=dtype, device=device)
        self.output = torch.empty(elements * (world if op == "all_gather" else 1), dtype=dtype,
                                  device=device) if op in ("all_gather", "all_to_all") else None
        self.nbytes = (self.output if op == "all_gather" else self.input).numel() * \
            self.input.element_size()

    def __call__(self, async_op=False):
        c, t = self.comm, self.input
        if self.op == "all_reduce":
            return c.all_reduce(t, async_op=async_op)
        if self.op == "all_gather":
            return c.all_gather_into_tensor(self.output, t, async_op=async_op)
        if self.op == "all_to_all":
            return c.all_to_all_single(self.output, t, async_op=async_op)
        if self.op == "broadcast":
            return c.broadcast(t, 0, async_op=async_op)
        if self.rank == 0:  # pt2pt: rank 0 sends to rank 1; the other ranks only time
            return c.isend(t, 1) if async_op else c.send(t, 1)
        if self.rank == 1:
            return c.irecv(t, 0) if async_op else c.recv(t, 0)
        return None

    def check(self):
        """One call with inputs whose result is known; raises when the data is wrong."""
        import torch

        value = float(self.rank + 1)
        self.input.fill_(value)
        self()
        world = self.world
        if self.op == "all_reduce":
            expect = torch.full_like(self.input, world * (world + 1) / 2)
            got = self.input
        elif self.op == "all_gather":
            expect = torch.arange(1, world + 1, dtype=self.input.dtype,
                                  device=self.input.device).repeat_interleave(self.elements)
            got = self.output
        elif self.op == "all_to_all":
            block = self.elements // world
            expect = torch.arange(1, world + 1, dtype=self.input.dtype,
                                  device=self.input.device).repeat_interleave(block)
            got = self.output
        elif self.op == "broadcast":
            expect, got = torch.ones_like(self.input), self.input
        else:
            expect = torch.ones_like(self.input) if self.rank == 1 else self.input
            got = self.input
        if not torch.equal(got, expect):
            raise RuntimeError(f"ds_bench: {self.op} of {self.elements} elements returned wrong "
                               f"data on rank {self.rank}")


def _time(case, args, accelerator):
    comm = case.comm
    for _ in range(args.warmups):
        case()
    accelerator.synchronize()
    comm.barrier()
    start = time.perf_counter()
    if args.async_op:
        works = [case(async_op=True) for _ in range(args.trials)]
        for work in works:
            if work is not None:
                work.wait()
    else:
        for _ in range(args.trials):
            case()
    accelerator.synchronize()
    return (time.perf_counter() - start) / args.trials


def message_sizes(args, op, world, element_size, free_bytes):
    """Elements per message: the scan, or the single size that fits ``--mem-factor``."""
    if args.scan:
        return [2 ** p for p in range(1, args.maxsize)] or [2]
    elements = 2 ** max(args.maxsize - 1, 1)
    budget = args.mem_factor * free_bytes
    while elements > 2 and elements * element_size * BUFFERS[op](world) > budget:
        elements //= 2
    return [elements]


def run_benchmarks(args, out=None):
    """Every selected op at every size on this rank; returns the rows (identical on all ranks)
    and prints them on rank 0 (every rank with ``--debug``)."""
    import torch

    from deepspeed.accelerator import get_accelerator

    comm, accelerator = _comm(args), get_accelerator()
    out = out or sys.stdout
    world, rank = comm.get_world_size(), comm.get_rank()
    device = accelerator.current_device_name()
    element_size = torch.empty(0, dtype=args.torch_dtype).element_size()
    rows = []
    for op in selected_ops(args):
        if op == "pt2pt" and world < 2:
            if rank == 0:
                print("ds_bench: pt2pt needs at least 2 ranks; skipped", file=out)
            continue
        op_rows = []
        for elements in message_sizes(args, op, world, element_size, accelerator.available_memory()):
            case = _Case(comm, op, elements, args.torch_dtype, device, world, rank)
            mine = _time(case, args, accelerator)
            slowest = torch.tensor([mine], dtype=torch.float64, device=device)
            comm.all_reduce(slowest, op=comm.ReduceOp.MAX)
            seconds = float(slowest.item())
            case.check()
            algbw = case.nbytes / seconds
            op_rows.append(Row(op, case.elements, case.nbytes, seconds, algbw,
                               algbw * BUS_FACTOR[op](world)))
            if args.debug:
                print(f"[rank {rank}] {op} {case.elements} elements: {mine * 1e6:.2f} us", file=out)
        if rank == 0 or args.debug:
            print_table(op, op_rows, args, world, out)
        rows.extend(op_rows)
    return rows


def _human_bytes(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def _human_time(seconds):
    return f"{seconds * 1e6:.2f} us" if seconds < 1e-3 else f"{seconds * 1e3:.3f} ms"


def print_table(op, rows, args, world, out):
    unit = args.bw_unit
    print(f"\n---- Performance of {op} on {world} ranks ({args.dist} comm, {args.dtype}, "
          f"{args.trials} trials) ----", file=out)
    print(f"{'Size (Bytes)':20s}{'Description':25s}{'Duration':20s}{f'Throughput ({unit})':20s}"
          f"{f'BusBW ({unit})':20s}", file=out)
    for row in rows:
        alg, bus = row.bandwidths(unit)
        if args.raw:
            cells = (row.nbytes, f"{row.elements}x{args.dtype}", f"{row.seconds * 1e6:.3f}",
                     f"{alg:.6f}", f"{bus:.6f}")
        else:
            cells = (_human_bytes(row.nbytes), f"{row.elements}x{args.dtype}",
                     _human_time(row.seconds), f"{alg:.3f}", f"{bus:.3f}")
        print("".join(f"{str(c):20s}" if i != 1 else f"{str(c):25s}" for i, c in enumerate(cells)),
              file=out)


def main(argv=None):
    args = parse_args(argv)
    import deepspeed.comm as dist

    dist.init_distributed(dist_backend=args.backend, verbose=False)
    run_benchmarks(args)
    dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
