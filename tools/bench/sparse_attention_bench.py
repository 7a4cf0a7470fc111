"""Sparse (Fixed pattern, block 16) vs dense ``scaled_dot_product_attention``, on CPU or one GPU.

Three contestants, each timed in the same run: ``sparse`` (``SparseSelfAttention`` as shipped:
the fused row-group path on CPU), ``blocked`` (``backend="blocked"``: the blocked torch
composition sdd -> softmax -> dsd that was the CPU path before) and ``dense`` (SDPA, no mask);
``--flex`` adds ``flex``: ``torch.nn.attention.flex_attention`` under ``torch.compile`` with a
``BlockMask`` of the layout at block 16 (its first call includes the compile).
Each measurement runs in a fresh subprocess so its peak RSS (``ru_maxrss``) is its own; the
reported memory is that peak minus the RSS after the inputs were made. Forward only, fp32,
batch 1, 8 heads, head dim 64. Prints density, time and memory side by side and the target
``time ratio <= 2 * density + 0.1``.

On a GPU (``--device cuda``, the default where one is): fp16, ``sparse`` is the Triton
block-sparse kernels, ``row_groups`` the row-group plan on torch's CUDA flash kernel
(``backend="torch"``), ``dense`` is SDPA held to its flash kernel, ``blocked`` is left out unless
asked for; times are synchronised wall clock (best of ``--repeats`` after a warm-up that
includes Triton's compile), memory is the caching allocator's peak above the inputs.
``--block`` takes several block sizes (the pattern keeps 4 local blocks and 1 global one each).

    python tools/bench/sparse_attention_bench.py [--seqs 4096 16384] [--repeats 3]
    python tools/bench/sparse_attention_bench.py --device cuda --block 16 64 --json figures.jsonl
    python tools/bench/sparse_attention_bench.py --dry-run      # tiny, CPU
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

HEADS, HEAD_DIM = 8, 64


def _rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _child(kind, seq, repeats, attention, block, device_name):
    import torch
    import torch.nn.functional as F

    from deepspeed.sparse_attention import FixedSparsityConfig, SparseSelfAttention

    device = torch.device(device_name)
    on_gpu = device.type == "cuda"
    dtype = torch.float16 if on_gpu else torch.float32
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, seq, HEAD_DIM, device=device, dtype=dtype)
               for _ in range(3))
    cfg = FixedSparsityConfig(HEADS, block=block, num_local_blocks=4, num_global_blocks=1,
                              attention=attention)
    backend = {"blocked": "blocked", "row_groups": "torch"}.get(kind)
    sparse = SparseSelfAttention(cfg, max_seq_length=seq, backend=backend)
    layout = sparse.get_layout(seq)
    density = float(layout.float().mean())
    if kind == "flex":
        from torch.nn.attention.flex_attention import BlockMask, flex_attention

        lay = layout.bool()
        block_mask = BlockMask.from_kv_blocks(
            lay.sum(-1).to(torch.int32)[None],
            torch.argsort((~lay).to(torch.int8), dim=-1, stable=True).to(torch.int32)[None],
            BLOCK_SIZE=block)
        compiled = torch.compile(flex_attention)

        def run():
            return compiled(q, k, v, block_mask=block_mask)
    elif kind in ("sparse", "blocked", "row_groups"):
        def run():
            return sparse(q, k, v)
    else:
        causal = attention == "unidirectional"

        def run():
            if not on_gpu:
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # dense at its fastest
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def timed():
        if on_gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if on_gpu:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
        base_bytes = torch.cuda.memory_allocated()
    base = _rss_mib()  # inputs and layout made; nothing computed yet
    with torch.no_grad():
        first = timed()  # warm-up (index tables, plan, allocator, Triton's compile)
        times = [timed() for _ in range(repeats)]
    extra = ((torch.cuda.max_memory_allocated() - base_bytes) / 2**20 if on_gpu
             else _rss_mib() - base)
    return {"kind": kind, "seq": seq, "block": block, "density": density, "time_s": min(times),
            "first_s": first, "peak_extra_mib": extra, "nnz_blocks": int(layout.sum()),
            "device": str(device), "dtype": str(dtype)}


def measure(kind, seq, repeats, attention, block, device, in_process=False):
    """One measurement in a fresh process (its own peak memory), or in this one (a dry run)."""
    if in_process:
        return _child(kind, seq, repeats, attention, block, device)
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(seq), str(repeats),
                          attention, str(block), device], capture_output=True, text=True)
    if out.returncode != 0:
        return {"kind": kind, "seq": seq, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_figures import emit, target

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attention", choices=["bidirectional", "unidirectional"], default="bidirectional")
    parser.add_argument("--skip-blocked", action="store_true",
                        help="leave out the blocked path (slow and memory-hungry at 16384)")
    parser.add_argument("--flex", action="store_true",
                        help="also time flex_attention + torch.compile (compiles for ~1 min)")
    parser.add_argument("--block", type=int, nargs="+", default=[16])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--with-blocked", action="store_true",
                        help="on a GPU, also time the blocked torch path")
    parser.add_argument("--json", default=None, help="append the figures record to this file")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, one repeat (CPU)")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.seqs, args.repeats, args.device, args.block = [256], 1, "cpu", [16]
    run = lambda *a: measure(*a, in_process=args.dry_run)  # noqa: E731
    on_gpu = args.device.startswith("cuda")
    print(f"Fixed(num_local_blocks=4, num_global_blocks=1, {args.attention}), block(s) "
          f"{args.block}, {HEADS} heads x {HEAD_DIM}, batch 1, "
          f"{'fp16' if on_gpu else 'fp32'} forward on {args.device}, best of {args.repeats}")
    kinds = ["sparse", "blocked", "dense"]
    if args.skip_blocked or (on_gpu and not args.with_blocked):
        kinds.remove("blocked")
    if on_gpu:  # the row-group plan on torch's CUDA flash kernel (backend="torch")
        kinds.insert(1, "row_groups")
    if args.flex:
        kinds.insert(-1, "flex")
    print(f"{'seq':>6} {'block':>5} {'density':>8} {'target':>7} {'path':>8} {'time s':>8} "
          f"{'first s':>8} {'ratio':>6} {'peak MiB':>9}")
    for seq in args.seqs:  # one record per length: a step cut short keeps the lengths done
        figures, targets = {}, {}
        dense = run("dense", seq, args.repeats, args.attention, args.block[0], args.device)
        if "error" not in dense:
            figures[f"s{seq}_dense_ms"] = dense["time_s"] * 1e3
            figures[f"s{seq}_dense_peak_mib"] = dense["peak_extra_mib"]
        for block in args.block:
            for kind in kinds[:-1]:
                r = run(kind, seq, args.repeats, args.attention, block, args.device)
                if "error" in r or "error" in dense:
                    print(f"{seq:>6} {block:>5} {kind} failed: "
                          f"{r.get('error') or dense.get('error')}")
                    figures[f"s{seq}_b{block}_{kind}_error"] = r.get("error") or dense["error"]
                    continue
                limit = 2 * r["density"] + 0.1
                ratio = r["time_s"] / dense["time_s"]
                key = f"s{seq}_b{block}_{kind}"
                figures.update({f"{key}_ms": r["time_s"] * 1e3, f"{key}_density": r["density"],
                                f"{key}_time_vs_dense": ratio, f"{key}_target": limit,
                                f"{key}_peak_mib": r["peak_extra_mib"]})
                if kind in ("sparse", "row_groups"):
                    suffix = "" if kind == "sparse" else "_row_groups"
                    targets[f"sparse_attention_{seq}_block{block}{suffix}_time_vs_dense"] = \
                        target(ratio, "<=", limit)
                print(f"{seq:>6} {block:>5} {r['density']:>8.3f} {limit:>7.2f} {kind:>8} "
                      f"{r['time_s']:>8.4f} {r['first_s']:>8.3f} {ratio:>6.2f} "
                      f"{r['peak_extra_mib']:>9.0f}   nnz blocks {r['nnz_blocks']}")
        if "error" not in dense:
            print(f"{seq:>6} {'':>5} {1.0:>8.3f} {'':>7} {'dense':>8} {dense['time_s']:>8.4f} "
                  f"{dense['first_s']:>8.3f} {1.0:>6.2f} {dense['peak_extra_mib']:>9.0f}")
        emit(args.json, "sparse_attention", figures, targets, dry_run=args.dry_run)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5],
                                int(sys.argv[6]), sys.argv[7])))
    else:
        main()
