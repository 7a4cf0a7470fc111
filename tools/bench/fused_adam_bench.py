"""Step time of DeepSpeed's FusedAdam (CUDA multi-tensor kernel, and its PyTorch path) against
torch.optim.AdamW(fused=True) on the same params, timed with CUDA events; FusedLamb's kernel
against its PyTorch path with ``--lamb``.

    python tools/bench/fused_adam_bench.py --params 200 --numel 1000000 --dtype fp32 bf16
    python tools/bench/fused_adam_bench.py --dry-run        # tiny, on CPU: no kernel, no timing

Contestants per dtype, each on fresh params of the same values: ``kernel`` (FusedAdam, csrc/adam),
``pytorch_path`` (FusedAdam with ``use_cuda_kernel=False``: torch's fused kernel on the tensors
as they are), ``torch_fused`` (the baseline), and for 16-bit params ``kernel_fp32_moments`` (the
op on 16-bit params and grads with fp32 moments). Targets (issue 38): kernel >= 1.0x torch's
throughput at 100M+ elements in fp32 and bf16; the bf16 PyTorch path within 1.2x of torch's
time. Before timing, one step of each is compared with torch's (the fraction of elements more
than 2 ulps off; fp32 moments are compared with torch's kernel on fp32 copies), so a fast wrong
kernel cannot pass. GB/s counts each list read once and params and moments written once.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_figures import copy_gbs, emit, median_ms, target  # noqa: E402

from deepspeed.ops.adam import FusedAdam  # noqa: E402
from deepspeed.ops.adam.fused_adam import CHUNK_SIZE, load_cuda_op  # noqa: E402
from deepspeed.ops.lamb import FusedLamb  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
HYPER = dict(lr=1e-3, weight_decay=0.01)


def sizes_of(count, numel):
    """Mixed sizes around ``numel`` so segmenting and table overflow are both exercised."""
    return [max(1, numel // (1 + i % 4)) for i in range(count)]


def make_params(sizes, dtype, device, state_dtype=None):
    """Params with gradients (same values for every contestant: one seeded generator)."""
    g = torch.Generator(device=device).manual_seed(0)
    params = []
    for n in sizes:
        p = torch.nn.Parameter(torch.randn(n, device=device, generator=g).to(dtype))
        p.grad = torch.randn(n, device=device, generator=g).to(dtype)
        params.append(p)
    return params


class RawKernel:
    """The op on 16-bit params with fp32 moments (FusedAdam keeps moments in the params' dtype,
    so this contestant calls the op directly)."""

    def __init__(self, params, op):
        self.params, self.op, self.step_count = params, op, 0
        self.m = [torch.zeros_like(p, dtype=torch.float32) for p in params]
        self.v = [torch.zeros_like(p, dtype=torch.float32) for p in params]

    def step(self):
        self.step_count += 1
        self.op.multi_tensor_adam(CHUNK_SIZE, [self.params, [p.grad for p in self.params],
                                               self.m, self.v],
                                  lr=HYPER["lr"], beta1=0.9, beta2=0.999, eps=1e-8,
                                  step=self.step_count, mode=1, bias_correction=True,
                                  weight_decay=HYPER["weight_decay"])


class Fp32CopiesReference:
    """torch's fused AdamW on fp32 copies of 16-bit params with fp32 moments, rounded back: what
    the fp32-moment kernel computes."""

    def __init__(self, params):
        self.params = params
        self.masters = [p.detach().float() for p in params]
        self.inner = torch.optim.AdamW(self.masters, fused=True, **HYPER)

    def step(self):
        for master, p in zip(self.masters, self.params):
            master.copy_(p.detach())
            master.grad = p.grad.float()
        self.inner.step()
        for master, p in zip(self.masters, self.params):
            p.data.copy_(master)


def contestants(dtype, op):
    def pytorch_path(p):
        opt = FusedAdam(p, **HYPER)
        opt.use_cuda_kernel = False
        return opt

    found = {}
    if op is not None:
        found["kernel"] = lambda p: FusedAdam(p, **HYPER)
        if dtype != torch.float32:
            found["kernel_fp32_moments"] = lambda p: RawKernel(p, op)
    found["pytorch_path"] = pytorch_path
    found["torch_fused"] = lambda p: torch.optim.AdamW(p, fused=True, **HYPER)
    return found


def one_step_error(make, reference, sizes, dtype, device):
    """The fraction of params more than 2 ulps (of their dtype) away from the reference's after
    one step from the same values: 0 for a kernel doing the same math, ~1 for a wrong one."""
    ours, theirs = make_params(sizes, dtype, device), make_params(sizes, dtype, device)
    make(ours).step()
    reference(theirs).step()
    eps = torch.finfo(dtype).eps
    bad = sum(int(((a.float() - b.float()).abs()
                   > 2 * eps * b.float().abs().clamp(min=1e-3)).sum())
              for a, b in zip(ours, theirs))
    return bad / sum(sizes)


def bytes_per_step(total, dtype, name):
    state = 4 if name == "kernel_fp32_moments" else dtype.itemsize
    return total * (3 * dtype.itemsize + 4 * state)  # read p, g, m, v; write p, m, v


def bench_adam(args, dtype_name, device, op):
    dtype = DTYPES[dtype_name]
    sizes = sizes_of(args.params, args.numel)
    total = sum(sizes)
    figures = {"elements": total, "tensors": len(sizes)}
    makers = contestants(dtype, op)
    for name, make in makers.items():
        if name != "torch_fused":
            reference = (Fp32CopiesReference if name == "kernel_fp32_moments"
                         else makers["torch_fused"])
            figures[f"{name}_err"] = one_step_error(make, reference, sizes, dtype, device)
        optimizer = make(make_params(sizes, dtype, device))
        ms = median_ms(optimizer.step, iters=args.steps, warmup=args.warmup)
        figures[f"{name}_ms"] = ms
        figures[f"{name}_gbs"] = bytes_per_step(total, dtype, name) / ms / 1e6
        del optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
        check = (f"  one step: {figures[f'{name}_err']:.1e} of elements >2 ulps off torch's"
                 if f"{name}_err" in figures else "")
        print(f"{dtype_name} {name:20s} {ms:8.3f} ms/step {figures[f'{name}_gbs']:8.1f} GB/s"
              + check)
    targets = {}
    if "kernel_ms" in figures:
        speed = figures["torch_fused_ms"] / figures["kernel_ms"]
        figures["kernel_speed_vs_torch"] = speed
        targets[f"adam_kernel_{dtype_name}_vs_torch_fused"] = target(speed, ">=", 1.0)
    slowdown = figures["pytorch_path_ms"] / figures["torch_fused_ms"]
    figures["pytorch_path_time_vs_torch"] = slowdown
    if dtype == torch.bfloat16:
        targets["adam_pytorch_path_bf16_time_vs_torch_fused"] = target(slowdown, "<=", 1.2)
    for name in makers:
        if f"{name}_err" in figures:  # rounding-order flips only, never whole tensors
            targets[f"adam_{name}_{dtype_name}_elements_off"] = target(
                figures[f"{name}_err"], "<=", 1e-3)
    return figures, targets


def bench_lamb(args, device):
    """FusedLamb: its kernel against its PyTorch path (there is no torch LAMB), fp32."""
    sizes = sizes_of(args.params, args.numel)
    figures = {}
    for name, native in (("lamb_kernel", True), ("lamb_pytorch_path", False)):
        if native and load_cuda_op("fused_lamb") is None:
            continue
        optimizer = FusedLamb(make_params(sizes, torch.float32, device), lr=1e-3)
        optimizer.use_cuda_kernel = native
        figures[f"{name}_ms"] = median_ms(optimizer.step, iters=args.steps, warmup=args.warmup)
        print(f"fp32 {name:20s} {figures[f'{name}_ms']:8.3f} ms/step")
        del optimizer
    if "lamb_kernel_ms" in figures:
        figures["lamb_kernel_speed_vs_pytorch_path"] = (figures["lamb_pytorch_path_ms"]
                                                        / figures["lamb_kernel_ms"])
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=200, help="number of param tensors")
    parser.add_argument("--numel", type=int, default=1_000_000, help="elements of the largest")
    parser.add_argument("--dtype", choices=sorted(DTYPES), nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--lamb", action="store_true", help="also time FusedLamb")
    parser.add_argument("--json", default=None, help="append the figures record to this file")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny sizes on CPU: the PyTorch path and torch's fused kernel only")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.params, args.numel, args.steps, args.warmup = 4, 1000, 2, 1
    elif not torch.cuda.is_available():
        sys.exit("fused_adam_bench: needs a CUDA GPU (or --dry-run)")
    if args.params < 1 or args.numel < 1 or args.steps < 1:
        sys.exit("fused_adam_bench: --params, --numel and --steps must be >= 1")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    op = load_cuda_op("fused_adam") if device.type == "cuda" else None
    if op is None:
        print("fused_adam CUDA op unavailable here (see the log): timing the PyTorch path and "
              "torch only")
    total = sum(sizes_of(args.params, args.numel))
    print(f"{args.params} tensors, {total / 1e6:.1f}M elements, "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}, "
          f"median of {args.steps} steps")
    copy = copy_gbs()
    for dtype_name in args.dtype:  # one record each: a step cut short keeps the dtypes done
        found, met = bench_adam(args, dtype_name, device, op)
        emit(args.json, "fused_adam", dict({f"{dtype_name}_{k}": v for k, v in found.items()},
                                           copy_gbs=copy), met, dry_run=args.dry_run)
    if args.lamb:
        emit(args.json, "fused_lamb", bench_lamb(args, device), dry_run=args.dry_run)


if __name__ == "__main__":
    main()
