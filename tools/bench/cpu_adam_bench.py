"""Step time of DeepSpeedCPUAdam's native kernel against torch.optim.AdamW(fused=True) and the
memory-bandwidth floor, on flat fp32 params (ZeRO-Offload's host step).

    python tools/bench/cpu_adam_bench.py [--sizes 10M 100M --reps 10]

Per size it times, interleaved round by round so machine noise hits all alike:
  ds        DeepSpeedCPUAdam.step() (native kernel)
  torch     torch.optim.AdamW(fused=True).step()
  ds+bf16   DeepSpeedCPUAdam.step(fp16_param_groups=...) writing a bf16 copy in the same pass
  torch+bf16  AdamW(fused=True).step() then bf16_copy.copy_(param) (a separate pass)
The floor is the bytes an Adam step must move (read p, g, m, v and write p, m, v: 28 B/param;
+2 B for the bf16 copy) divided by the best memory bandwidth torch reaches in the same run on
simple streaming ops of the same size (copy_: 8 B/element, add out=: 12 B/element, in-place
add_: 12 B/element); taking the best makes the floor a lower bound. Figures are medians over
rounds, with the best round beside them. Nothing asserts on time; it is a tool.
"""
import argparse
import platform
import statistics
import time

import torch

from deepspeed.ops.adam import DeepSpeedCPUAdam

SUFFIX = {"K": 10**3, "M": 10**6, "G": 10**9}


def parse_size(text):
    text = text.strip().upper()
    if text and text[-1] in SUFFIX:
        return int(float(text[:-1]) * SUFFIX[text[-1]])
    return int(text)


def stream_bandwidth(numel, reps):
    """The best bytes per second of torch's streaming ops on fp32, and each op's figure."""
    a, b, out = torch.randn(numel), torch.randn(numel), torch.empty(numel)
    ops = {"copy_": (8, lambda: out.copy_(a)),
           "add(out=)": (12, lambda: torch.add(a, b, out=out)),
           "add_": (12, lambda: out.add_(a))}
    figures = {}
    for name, (bytes_per_element, fn) in ops.items():
        fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        figures[name] = bytes_per_element * numel / statistics.median(times)
    return max(figures.values()), figures


def make_contestants(numel):
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(numel, generator=gen)
    grad = torch.randn(numel, generator=gen)

    def param():
        p = torch.nn.Parameter(start.clone())
        p.grad = grad.clone()
        return p

    ds_p, ds16_p, t_p, t16_p = param(), param(), param(), param()
    ds = DeepSpeedCPUAdam([ds_p], lr=1e-3, weight_decay=0.01, use_native=True)
    ds16 = DeepSpeedCPUAdam([ds16_p], lr=1e-3, weight_decay=0.01, use_native=True)
    tf = torch.optim.AdamW([t_p], lr=1e-3, weight_decay=0.01, fused=True)
    tf16 = torch.optim.AdamW([t16_p], lr=1e-3, weight_decay=0.01, fused=True)
    ds16_half = torch.empty(numel, dtype=torch.bfloat16)
    t16_half = torch.empty(numel, dtype=torch.bfloat16)

    def torch_bf16():
        tf16.step()
        t16_half.copy_(t16_p.detach())

    contestants = {
        "ds": ds.step,
        "torch": tf.step,
        "ds+bf16": lambda: ds16.step(fp16_param_groups=[[ds16_half]]),
        "torch+bf16": torch_bf16,
    }
    check = (ds_p, t_p, ds16_p, ds16_half)
    return contestants, check


def bench(numel, reps, bandwidth):
    contestants, (ds_p, t_p, ds16_p, ds_half) = make_contestants(numel)
    for fn in contestants.values():  # warm-up: allocates state, pages memory in
        fn()
    times = {name: [] for name in contestants}
    names = list(contestants)
    for rnd in range(reps):
        for name in (names if rnd % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            contestants[name]()
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(values) for name, values in times.items()}
    best = {name: min(values) for name, values in times.items()}
    floor = 28 * numel / bandwidth
    floor16 = 30 * numel / bandwidth
    diff = (ds_p.detach() - t_p.detach()).abs().max().item() / t_p.detach().abs().max().item()
    print(f"\n{numel / 1e6:g}M params, {reps} rounds (median step time)")
    print(f"  check: ds vs torch fused after {reps + 1} steps: max rel diff {diff:.2e}; "
          f"fused bf16 copy == param.to(bf16): "
          f"{torch.equal(ds_half, ds16_p.detach().to(torch.bfloat16))}")
    for name in names:
        ref = floor16 if "bf16" in name else floor
        print(f"  {name:<11} {med[name] * 1e3:9.2f} ms   {med[name] / ref:5.2f}x floor   "
              f"(best round {best[name] * 1e3:.2f} ms, {best[name] / ref:.2f}x floor)")
    print(f"  floor       {floor * 1e3:9.2f} ms (28 B/param), {floor16 * 1e3:.2f} ms with bf16 "
          f"(30 B/param)")
    print(f"  ratio torch/ds            = {med['torch'] / med['ds']:.2f} median, "
          f"{best['torch'] / best['ds']:.2f} best  (>1: ds faster)")
    print(f"  ratio torch+bf16/ds+bf16  = {med['torch+bf16'] / med['ds+bf16']:.2f} median, "
          f"{best['torch+bf16'] / best['ds+bf16']:.2f} best")
    return med


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["10M", "100M"],
                        help="param counts, e.g. 10M 100M")
    parser.add_argument("--reps", type=int, default=10, help="timed rounds per size")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes]
    if args.reps < 1 or any(n < 1 for n in sizes):
        parser.error(f"--reps and --sizes must be positive, got {args.reps} and {args.sizes}")
    bandwidth, figures = stream_bandwidth(max(sizes), max(args.reps, 5))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{platform.processor() or platform.machine()}")
    print("stream bandwidth: " + ", ".join(f"{k} {v / 1e9:.2f} GB/s" for k, v in figures.items())
          + f"; floor uses {bandwidth / 1e9:.2f} GB/s")
    for numel in sizes:
        bench(numel, args.reps, bandwidth)


if __name__ == "__main__":
    main()
