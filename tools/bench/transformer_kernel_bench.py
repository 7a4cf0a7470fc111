"""DeepSpeedTransformerLayer vs HF ``BertLayer`` (the torch reference), and what each memory
flag saves.

Contestants, timed in the same run on the same weights and inputs (fp32 on CPU, dropout 0, a
padding mask): ``hf_sdpa`` (``BertLayer``, attn_implementation "sdpa", HF's default),
``hf_eager`` (``BertLayer``, "eager"), ``ds`` (``DeepSpeedTransformerLayer`` as a user gets it:
its default ``auto`` backend, the torch blocks on every device) and, on CUDA, ``ds_triton`` (the
layer's Triton kernels, ``backend="triton"``). Each step is forward + backward (``--eval``: forward only under
``no_grad``), in each ``--dtype`` (weights converted too; on a GPU fp16 and bf16 on one BERT-large
layer by default, the issue's target being ``ds`` >= 1.0x ``hf_sdpa``). Median of ``--repeats``
timings of ``--iters`` steps each, the contestants taking turns. Then the activation bytes
autograd keeps for backward (each storage once, parameters excluded; attention and hidden dropout
0.1 so the dropout tensors exist), for no flag, each flag alone, and all three.

    python tools/bench/transformer_kernel_bench.py [--hidden 256 --heads 4 --seq 128 --batch 8]
    python tools/bench/transformer_kernel_bench.py --dry-run     # tiny, CPU
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "core" / "ops"))
from transformer_reference import hf_bert_layer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_figures import emit, target  # noqa: E402

from deepspeed.ops.transformer import DeepSpeedTransformerConfig, DeepSpeedTransformerLayer  # noqa: E402

FLAGS = ("normalize_invertible", "gelu_checkpoint", "attn_dropout_checkpoint")


def _config(args, **kw):
    base = dict(hidden_size=args.hidden, heads=args.heads, intermediate_size=4 * args.hidden,
                num_hidden_layers=24, initializer_range=0.02, attn_dropout_ratio=0.0,
                hidden_dropout_ratio=0.0, pre_layer_norm=False)
    base.update(kw)
    return DeepSpeedTransformerConfig(**base)


def _time_interleaved(steps, args, device):
    """Median seconds per step of each contestant; the contestants take turns within every
    repeat, so a change in the machine's load hits them alike."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for step in steps.values():
        for _ in range(2):
            step()
    times = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            sync()
            start = time.perf_counter()
            for _ in range(args.iters):
                step()
            sync()
            times[name].append((time.perf_counter() - start) / args.iters)
    return {name: statistics.median(t) for name, t in times.items()}


def _step(layer, x, mask, train):
    def run():
        if not train:
            with torch.no_grad():
                return layer(x, mask)
        out = layer(x, mask)
        out = out[0] if isinstance(out, tuple) else out
        out.sum().backward()
    return run


def _saved_bytes(layer, x, mask):
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, mask)
    return sum(seen.values())


DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def bench_dtype(args, device, dtype_name):
    """Time the contestants in one dtype (weights converted too, so no per-call casts)."""
    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    ds = DeepSpeedTransformerLayer(_config(args)).to(device)
    hf_sdpa = hf_bert_layer(ds.cpu()).to(device=device, dtype=dtype)
    hf_eager = hf_bert_layer(ds.cpu()).to(device=device, dtype=dtype)
    hf_eager.attention.self.config._attn_implementation = "eager"
    hf_sdpa.attention.self.config._attn_implementation = "sdpa"
    ds = ds.to(device=device, dtype=dtype)
    for layer in (ds, hf_sdpa, hf_eager):
        layer.train(not args.eval)
    x = torch.randn(args.batch, args.seq, args.hidden, device=device, dtype=dtype,
                    requires_grad=not args.eval)
    mask = torch.zeros(args.batch, 1, 1, args.seq, device=device, dtype=dtype)
    mask[:, ..., args.seq * 7 // 8:] = torch.finfo(dtype).min  # the last eighth is padding

    contestants = {"hf_sdpa": hf_sdpa, "hf_eager": hf_eager, "ds": ds}
    if device.type == "cuda":
        ds_triton = DeepSpeedTransformerLayer(_config(args)).to(device=device, dtype=dtype)
        ds_triton.load_state_dict(ds.state_dict())
        ds_triton.backend = "triton"
        contestants["ds_triton"] = ds_triton
    print(f"# {device} {dtype_name} hidden {args.hidden} heads {args.heads} seq {args.seq} batch "
          f"{args.batch}, {'forward' if args.eval else 'forward+backward'}, torch "
          f"{torch.__version__}, threads {torch.get_num_threads()}")
    times = _time_interleaved({name: _step(layer, x, mask, not args.eval)
                               for name, layer in contestants.items()}, args, device)
    figures = {}
    for name, seconds in times.items():
        figures[f"{dtype_name}_{name}_ms"] = seconds * 1e3
        print(f"{name:10s} {seconds * 1e3:9.2f} ms/step   hf_sdpa/{name} = "
              f"{times['hf_sdpa'] / seconds:5.2f}x")
    speed = times["hf_sdpa"] / times["ds"]
    figures[f"{dtype_name}_ds_speed_vs_hf_sdpa"] = speed
    return figures, {f"transformer_kernel_{dtype_name}_vs_hf_bertlayer": target(speed, ">=", 1.0)}


def saved_activations(args, device):
    print("# saved activation bytes per layer (dropout 0.1, train mode)")
    x_mem = torch.randn(args.batch, args.seq, args.hidden, device=device, requires_grad=True)
    mask = torch.zeros(args.batch, 1, 1, args.seq, device=device)
    base = None
    figures = {}
    for name, flags in ([("none", {})] + [(f, {f: True}) for f in FLAGS]
                        + [("all three", dict.fromkeys(FLAGS, True))]):
        layer = DeepSpeedTransformerLayer(_config(args, attn_dropout_ratio=0.1,
                                                  hidden_dropout_ratio=0.1, seed=1,
                                                  **flags)).to(device).train()
        size = _saved_bytes(layer, x_mem, mask)
        base = base or size
        figures[f"saved_bytes_{name.replace(' ', '_')}"] = size
        print(f"{name:24s} {size / 2**20:8.2f} MiB   {size / base:5.2f} of no flag")
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    on_gpu = torch.cuda.is_available()
    # GPU defaults: one BERT-large layer; CPU defaults: a small one
    parser.add_argument("--hidden", type=int, default=1024 if on_gpu else 256)
    parser.add_argument("--heads", type=int, default=16 if on_gpu else 4)
    parser.add_argument("--seq", type=int, default=512 if on_gpu else 128)
    parser.add_argument("--batch", type=int, default=16 if on_gpu else 8)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--eval", action="store_true", help="forward only, no_grad")
    parser.add_argument("--dtype", nargs="+", choices=sorted(DTYPES),
                        default=["fp16", "bf16"] if on_gpu else ["fp32"])
    parser.add_argument("--device", default="cuda" if on_gpu else "cpu")
    parser.add_argument("--json", default=None, help="append the figures record to this file")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, one repeat (CPU)")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.hidden, args.heads, args.seq, args.batch, args.iters, args.repeats = 32, 2, 16, 2, 1, 1
        args.device, args.dtype = "cpu", ["fp32"]
    device = torch.device(args.device)
    figures, targets = {}, {}
    for dtype_name in args.dtype:
        found, met = bench_dtype(args, device, dtype_name)
        figures.update(found)
        targets.update(met if dtype_name != "fp32" else {})
    figures.update(saved_activations(args, device))
    emit(args.json, "transformer_kernel", figures, targets, dry_run=args.dry_run)


if __name__ == "__main__":
    main()
