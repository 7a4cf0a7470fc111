"""Sparse (Fixed pattern, block 16) vs dense ``scaled_dot_product_attention`` on CPU.

Three contestants, each timed in the same run: ``sparse`` (``SparseSelfAttention`` as shipped:
the fused row-group path on CPU), ``blocked`` (``backend="blocked"``: the blocked torch
composition sdd -> softmax -> dsd that was the CPU path before) and ``dense`` (SDPA, no mask);
``--flex`` adds ``flex``: ``torch.nn.attention.flex_attention`` under ``torch.compile`` with a
``BlockMask`` of the layout at block 16 (its first call includes the compile).
Each measurement runs in a fresh subprocess so its peak RSS (``ru_maxrss``) is its own; the
reported memory is that peak minus the RSS after the inputs were made. Forward only, fp32,
batch 1, 8 heads, head dim 64. Prints density, time and memory side by side and the target
``time ratio <= 2 * density + 0.1``.

    python tools/bench/sparse_attention_bench.py [--seqs 4096 16384] [--repeats 3]
"""
import argparse
import json
import resource
import subprocess
import sys
import time

HEADS, HEAD_DIM, BLOCK = 8, 64, 16


def _rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _child(kind, seq, repeats, attention):
    import torch
    import torch.nn.functional as F

    from deepspeed.sparse_attention import FixedSparsityConfig, SparseSelfAttention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, seq, HEAD_DIM) for _ in range(3))
    cfg = FixedSparsityConfig(HEADS, block=BLOCK, num_local_blocks=4, num_global_blocks=1,
                              attention=attention)
    sparse = SparseSelfAttention(cfg, max_seq_length=seq,
                                 backend="blocked" if kind == "blocked" else None)
    layout = sparse.get_layout(seq)
    density = float(layout.float().mean())
    if kind == "flex":
        from torch.nn.attention.flex_attention import BlockMask, flex_attention

        lay = layout.bool()
        block_mask = BlockMask.from_kv_blocks(
            lay.sum(-1).to(torch.int32)[None],
            torch.argsort((~lay).to(torch.int8), dim=-1, stable=True).to(torch.int32)[None],
            BLOCK_SIZE=BLOCK)
        compiled = torch.compile(flex_attention)

        def run():
            return compiled(q, k, v, block_mask=block_mask)
    elif kind in ("sparse", "blocked"):
        def run():
            return sparse(q, k, v)
    else:
        causal = attention == "unidirectional"

        def run():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    base = _rss_mib()  # inputs and layout made; nothing computed yet
    with torch.no_grad():
        start = time.perf_counter()
        run()  # warm-up (index tables, plan, allocator); its peak counts, it is the same work
        first = time.perf_counter() - start
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
    return {"kind": kind, "seq": seq, "density": density, "time_s": min(times), "first_s": first,
            "peak_extra_mib": _rss_mib() - base, "nnz_blocks": int(layout.sum())}


def measure(kind, seq, repeats, attention):
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(seq), str(repeats), attention],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return {"kind": kind, "seq": seq, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attention", choices=["bidirectional", "unidirectional"], default="bidirectional")
    parser.add_argument("--skip-blocked", action="store_true",
                        help="leave out the blocked path (slow and memory-hungry at 16384)")
    parser.add_argument("--flex", action="store_true",
                        help="also time flex_attention + torch.compile (compiles for ~1 min)")
    args = parser.parse_args()
    print(f"Fixed(num_local_blocks=4, num_global_blocks=1, {args.attention}), block {BLOCK}, "
          f"{HEADS} heads x {HEAD_DIM}, batch 1, fp32 forward, best of {args.repeats}")
    kinds = ["sparse", "dense"] if args.skip_blocked else ["sparse", "blocked", "dense"]
    if args.flex:
        kinds.insert(-1, "flex")
    print(f"{'seq':>6} {'density':>8} {'target':>7} {'path':>8} {'time s':>7} {'first s':>8} "
          f"{'ratio':>6} {'peak MiB':>9}")
    for seq in args.seqs:
        res = {kind: measure(kind, seq, args.repeats, args.attention) for kind in kinds}
        dense = res["dense"]
        for kind in kinds:
            r = res[kind]
            if "error" in r or "error" in dense:
                print(f"{seq:>6} {kind} failed: {r.get('error') or dense.get('error')}")
                continue
            target = 2 * r["density"] + 0.1
            print(f"{seq:>6} {r['density']:>8.3f} {target:>7.2f} {kind:>8} {r['time_s']:>7.3f} "
                  f"{r['first_s']:>8.3f} {r['time_s'] / dense['time_s']:>6.2f} "
                  f"{r['peak_extra_mib']:>9.0f}   nnz blocks {r['nnz_blocks']}")


if __name__ == "__main__":
    main()
