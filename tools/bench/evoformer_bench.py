"""DS4Sci_EvoformerAttention vs the naive torch form (full score matrix): time and peak memory.

MSA row-wise attention (Q/K/V ``[B, N_seq, N_res, H, D]``, res_mask ``[B, N_seq, 1, 1, N_res]``,
pair_bias ``[B, 1, H, N_res, N_res]``) at each ``--n-res``; forward + backward with gradients for
Q, K, V and the pair bias. Contestants, timed in the same run (taking turns): ``evoformer`` (the
path the device selects: chunked torch on CPU, Triton kernels on CUDA) and ``naive``
(``softmax(QK^T/sqrt(D) + biases) V`` in plain torch). Peak memory: the allocations above the
inputs while one step runs (``deepspeed.testing.memory.peak_bytes``: the torch profiler's
allocation events on CPU, the caching allocator's peak on CUDA).

    python tools/bench/evoformer_bench.py [--n-seq 16 --n-res 128 256 384 --heads 4 --dim 32]
    python tools/bench/evoformer_bench.py --dry-run     # tiny, CPU
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_figures import emit  # noqa: E402

from deepspeed.ops.deepspeed4science import DS4Sci_EvoformerAttention, evoformer_attention_reference
from deepspeed.testing.memory import peak_bytes


def _inputs(args, n_res, device, dtype):
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (1, args.n_seq, n_res, args.heads, args.dim)
    q, k, v = (torch.randn(shape, generator=gen, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    mask = torch.rand((1, args.n_seq, 1, 1, n_res), generator=gen, device=device) > 0.1
    res_mask = (1e9 * (mask.to(dtype) - 1)).to(dtype)
    pair = torch.randn((1, 1, args.heads, n_res, n_res), generator=gen, device=device, dtype=dtype,
                       requires_grad=True)
    return q, k, v, [res_mask, pair]


def _step(fn, inputs):
    q, k, v, biases = inputs

    def run():
        fn(q, k, v, biases).float().sum().backward()
        for t in (q, k, v, biases[1]):
            t.grad = None
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-seq", type=int, default=16)
    parser.add_argument("--n-res", type=int, nargs="+", default=[128, 256, 384])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16/float16 "
                                                      "(CUDA default bfloat16)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None, help="append the figures record to this file")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, one repeat (CPU)")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.n_seq, args.n_res, args.heads, args.dim, args.repeats = 2, [16], 2, 8, 1
        args.device, args.dtype = "cpu", "float32"
    device = torch.device(args.device)
    figures = {}
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    print(f"# {device} {dtype} MSA row-wise, N_seq {args.n_seq}, heads {args.heads}, dim {args.dim}, "
          f"forward+backward, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"{'N_res':>6} {'evoformer ms':>13} {'naive ms':>9} {'speed':>6} {'evo peak MiB':>13} "
          f"{'naive peak MiB':>15} {'memory':>7}")
    for n_res in args.n_res:
        inputs = _inputs(args, n_res, device, dtype)
        steps = {"evoformer": _step(DS4Sci_EvoformerAttention, inputs),
                 "naive": _step(evoformer_attention_reference, inputs)}
        for step in steps.values():  # warm-up (and Triton's compile on CUDA)
            step()
        peaks = {name: peak_bytes(step, device)[0] for name, step in steps.items()}
        times = {name: [] for name in steps}
        for _ in range(args.repeats):
            for name, step in steps.items():
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                step()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - start)
        t = {name: statistics.median(v) for name, v in times.items()}
        figures.update({f"n{n_res}_evoformer_ms": t["evoformer"] * 1e3,
                        f"n{n_res}_naive_ms": t["naive"] * 1e3,
                        f"n{n_res}_speed_vs_naive": t["naive"] / t["evoformer"],
                        f"n{n_res}_evoformer_peak_bytes": peaks["evoformer"],
                        f"n{n_res}_naive_peak_bytes": peaks["naive"],
                        f"n{n_res}_memory_saving": peaks["naive"] / max(peaks["evoformer"], 1)})
        print(f"{n_res:6d} {t['evoformer'] * 1e3:13.1f} {t['naive'] * 1e3:9.1f} "
              f"{t['naive'] / t['evoformer']:5.2f}x {peaks['evoformer'] / 2**20:13.1f} "
              f"{peaks['naive'] / 2**20:15.1f} {peaks['naive'] / max(peaks['evoformer'], 1):6.1f}x")
    emit(args.json, "evoformer", figures, dry_run=args.dry_run)


if __name__ == "__main__":
    main()
