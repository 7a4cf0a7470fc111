"""NVMe optimizer offload: the optimizer step with and without ``pipeline_read`` /
``pipeline_write`` (one process, ZeRO-2, ``offload_optimizer.device: nvme``).

    python tools/bench/nvme_pipeline_bench.py [--params 16e6] [--sub-groups 8] [--nvme-path DIR]

The step swaps each sub-group in, steps it on the CPU and swaps it out. Without pipelining
every read and write finishes before the next sub-group steps; ``pipeline_read`` reads the next
sub-group while this one steps, ``pipeline_write`` writes this one while the next one steps.
All four combinations run in one process on the same model and directory, interleaved
``--repeats`` times; the figures are the median optimizer-step time of each and the time the
step spent blocked on I/O, with their ratios to the unpipelined run (lower is better). The
blocked time is the overlap itself; the step time gains only where the CPU has cycles to spare
while the I/O runs (on a busy 2-core host both compete for the same cores). The
swap directory defaults to a temporary directory (a page-cached disk unless it is a real NVMe
mount: aligned I/O goes O_DIRECT, so the disk is read). A tool, never a test: nothing asserts
on time.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=16e6, help="trainable parameters")
    parser.add_argument("--sub-groups", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nvme-path", default=None)
    return parser.parse_args(argv)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed_steps(torch, deepspeed, args, path, read, write):
    width = int((args.params / 2) ** 0.5)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, width))
    numel = sum(p.numel() for p in model.parameters())
    config = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10 ** 9,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
              "zero_optimization": {
                  "stage": 2, "sub_group_size": -(-numel // args.sub_groups),
                  "offload_optimizer": {"device": "nvme", "nvme_path": path,
                                        "pipeline_read": read, "pipeline_write": write}}}
    engine, zero, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                              config=config)
    waited = _time_waits(zero.swapper)
    x = torch.randn(4, width)
    times, waits = [], []
    for step in range(args.warmup + args.steps):
        engine.backward(engine(x).square().mean())
        waited[0] = 0.0
        start = time.perf_counter()
        engine.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
            waits.append(waited[0])
    engine.destroy()
    return numel, statistics.mean(times), statistics.mean(waits)


def _time_waits(swapper):
    """Accumulate the time the step spends blocked on the swapper's I/O (reads it waits for
    in swap_in, writes it waits for in swap_out or before a read of the same file)."""
    waited = [0.0]
    for name in ("_wait_reads", "wait"):
        original = getattr(swapper, name)

        def timed(*a, _original=original, **k):
            start = time.perf_counter()
            try:
                return _original(*a, **k)
            finally:
                waited[0] += time.perf_counter() - start

        setattr(swapper, name, timed)
    return waited


def main(argv=None):
    args = parse_args(argv)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0",
                      LOCAL_RANK="0", WORLD_SIZE="1")
    import torch

    import deepspeed
    from deepspeed.ops import aio

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    root = args.nvme_path or tempfile.mkdtemp(prefix="nvme_pipeline_bench_")
    combos = [(False, False), (True, False), (False, True), (True, True)]
    results = {f"read={r},write={w}": ([], []) for r, w in combos}
    for repeat in range(args.repeats):  # interleaved, so drift hits every combination alike
        for read, write in combos if repeat % 2 == 0 else combos[::-1]:
            numel, seconds, waited = timed_steps(torch, deepspeed, args, root, read, write)
            results[f"read={read},write={write}"][0].append(seconds)
            results[f"read={read},write={write}"][1].append(waited)
    step = {k: statistics.median(v[0]) for k, v in results.items()}
    wait = {k: statistics.median(v[1]) for k, v in results.items()}
    base = "read=False,write=False"
    print(f"{numel / 1e6:.1f} M parameters, {args.sub_groups} sub-groups, aio engine "
          f"{aio.backend()}, swap directory {root}, median of {args.repeats} runs")
    for name in step:
        print(f"  {name:24} optimizer step {step[name] * 1e3:8.1f} ms (ratio "
              f"{step[name] / step[base]:.2f}), blocked on I/O {wait[name] * 1e3:8.1f} ms "
              f"(ratio {wait[name] / wait[base]:.2f})")
    print(json.dumps({"params": numel, "sub_groups": args.sub_groups, "aio": aio.backend(),
                      "step_seconds": step, "blocked_on_io_seconds": wait,
                      "step_ratio_pipelined": step["read=True,write=True"] / step[base],
                      "blocked_ratio_pipelined": wait["read=True,write=True"] / wait[base]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
