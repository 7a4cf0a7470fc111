"""Step time of DeepSpeed's FusedAdam (CUDA multi-tensor kernel, and its PyTorch fallback path)
against torch.optim.AdamW(fused=True) on the same params, timed with CUDA events.

    python tools/bench/fused_adam_bench.py --params 200 --numel 1000000 --dtype bf16 --steps 50

Needs a CUDA GPU (and nvcc for the kernel; without it only the fallback and torch are timed).
"""
import argparse
import statistics
import sys

import torch

from deepspeed.ops.adam import FusedAdam
from deepspeed.ops.adam.fused_adam import load_cuda_op

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def make_params(count, numel, dtype):
    """Mixed sizes around ``numel`` so chunking and table overflow are both exercised."""
    g = torch.Generator(device="cuda").manual_seed(0)
    params = []
    for i in range(count):
        n = max(1, numel // (1 + i % 4))
        p = torch.nn.Parameter(torch.randn(n, device="cuda", generator=g).to(dtype))
        p.grad = torch.randn(n, device="cuda", generator=g).to(dtype)
        params.append(p)
    return params


def time_steps(optimizer, steps, warmup):
    """Median milliseconds per step() after ``warmup`` untimed steps."""
    for _ in range(warmup):
        optimizer.step()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        optimizer.step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=100, help="number of param tensors")
    parser.add_argument("--numel", type=int, default=1 << 20, help="elements of the largest")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("fused_adam_bench: needs a CUDA GPU (torch.cuda.is_available() is False)")
    if args.params < 1 or args.numel < 1 or args.steps < 1:
        sys.exit("fused_adam_bench: --params, --numel and --steps must be >= 1")
    dtype = DTYPES[args.dtype]
    contestants = {}
    if load_cuda_op("fused_adam") is not None:
        contestants["FusedAdam (CUDA kernel)"] = lambda p: FusedAdam(p, lr=1e-3, weight_decay=0.01)
    else:
        print("fused_adam CUDA op unavailable (see the log); timing the fallback only")

    def fallback(p):
        opt = FusedAdam(p, lr=1e-3, weight_decay=0.01)
        opt.use_cuda_kernel = False
        return opt

    contestants["FusedAdam (PyTorch path)"] = fallback
    contestants["torch AdamW(fused=True)"] = lambda p: torch.optim.AdamW(
        p, lr=1e-3, weight_decay=0.01, fused=True)
    total = sum(max(1, args.numel // (1 + i % 4)) for i in range(args.params))
    print(f"{args.params} tensors, {total / 1e6:.1f}M elements, {args.dtype}, "
          f"{torch.cuda.get_device_name()}")
    for name, make in contestants.items():
        ms = time_steps(make(make_params(args.params, args.numel, dtype)), args.steps, args.warmup)
        gbps = total * 7 * dtype.itemsize / ms / 1e6  # reads p, g, m, v; writes p, m, v
        print(f"{name:28s} {ms:8.3f} ms/step  {gbps:8.1f} GB/s")


if __name__ == "__main__":
    main()
