"""ZeRO-3 against ZeRO++ (qwZ, hpZ, qgZ alone and together): step time and bytes per step on
4 CPU ranks simulating 2 "nodes" x 2 (LOCAL_WORLD_SIZE=2, zero_hpz_partition_size=2); with
``--kernels``, the quantization kernels' own throughput on one GPU instead.

``--kernels``: int8 block quantize and dequantize (qwZ's weights, blocks of ``WEIGHT_BLOCK``;
the Triton kernels on CUDA) and 4-bit quantize (qgZ's gradients, blocks of ``GRAD_BLOCK``) of a
``--numel``-element bf16 tensor, median of CUDA-event-timed calls; GB/s counts the bytes each
must move (input read once, integers and scales written once, or the reverse), against the
device's nominal bandwidth and a device-to-device copy measured in the same run. A round trip
is checked to stay within scale/2 of the input first.

    python tools/bench/zeropp_bench.py --kernels [--numel 268435456] [--json figures.jsonl]
    python tools/bench/zeropp_bench.py --kernels --dry-run      # tiny, CPU (torch path)

    python tools/bench/zeropp_bench.py                          # GPT 4 x 256 (~3.4M), fp32
    python tools/bench/zeropp_bench.py --dtype bf16 --rounds 3
    python tools/bench/zeropp_bench.py --n_layer 8 --n_embd 768  # ~57M, the issue's "50M" (slow)

Every contestant is built once (its own model copy and engine, same initial weights, same
batches) and they take turns, ``--steps`` steps each per round, the order flipping every round;
a step time is the slowest rank's mean, the figure the median over rounds. Bytes come from the
comms logger (one ``CommsLogger`` observing one step per contestant): what rank 0 sends, in
total and to the other node, by the direct-exchange model of ``deepspeed.zero.zeropp.volume``.
Every ratio is against ZeRO-3 measured in the same run. Gloo on a CPU moves bytes through
memory, so the step time shows the quantization's compute cost, not the bandwidth it saves on
a real inter-node link; the byte ratios are the transferable result. A tool, never a test.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "examples"),
                str(Path(__file__).resolve().parent)]

CONTESTANTS = {
    "zero3": {},
    "qwZ": {"zero_quantized_weights": True},
    "hpZ": {"zero_hpz_partition_size": 2},
    "qgZ": {"zero_quantized_gradients": True},
    "zero++": {"zero_quantized_weights": True, "zero_hpz_partition_size": 2,
               "zero_quantized_gradients": True},
}


def kernels_main(args):
    """``--kernels``: see the module doc."""
    from bench_figures import copy_gbs, device_info, emit, median_ms
    from deepspeed.zero.zeropp.quantize import (GRAD_BLOCK, WEIGHT_BLOCK, blocks_of, dequantize,
                                                quantize)

    on_gpu = torch.cuda.is_available() and not args.dry_run
    if not on_gpu and not args.dry_run:
        sys.exit("zeropp_bench --kernels: needs a CUDA GPU (or --dry-run)")
    device = torch.device("cuda" if on_gpu else "cpu")
    numel = 1 << 16 if args.dry_run else args.numel
    x = torch.randn(numel, device=device).to(torch.bfloat16)
    figures = {"numel": numel, "copy_gbs": copy_gbs()}
    nominal = device_info()["nominal_tbs"]
    for bits, block, name in ((8, WEIGHT_BLOCK, "int8_weights"), (4, GRAD_BLOCK, "int4_grads")):
        nblocks = blocks_of(numel, block)
        q, scales = quantize(x, block, bits)
        back = dequantize(q, scales, numel, torch.float32)
        worst = float(((back - x.float()).abs().view(-1)[:numel]
                       - scales.repeat_interleave(block)[:numel] / 2).max())
        figures[f"{name}_roundtrip_within_half_scale"] = worst <= 1e-6
        q_ms = median_ms(lambda: quantize(x, block, bits))
        d_ms = median_ms(lambda: dequantize(q, scales, numel, torch.bfloat16))
        # quantize reads bf16, writes one byte per element (4-bit: kept one per byte) + scales
        moved = numel * 2 + nblocks * block + nblocks * 4
        figures.update({f"{name}_quantize_ms": q_ms, f"{name}_dequantize_ms": d_ms,
                        f"{name}_quantize_gbs": moved / q_ms / 1e6,
                        f"{name}_dequantize_gbs": moved / d_ms / 1e6})
        for op in ("quantize", "dequantize"):
            gbs = figures[f"{name}_{op}_gbs"]
            if nominal:
                figures[f"{name}_{op}_vs_nominal"] = gbs / (nominal * 1e3)
            if figures["copy_gbs"]:
                figures[f"{name}_{op}_vs_copy"] = gbs / figures["copy_gbs"]
            print(f"{name:13s} {op:10s} {figures[f'{name}_{op}_ms']:8.3f} ms {gbs:8.1f} GB/s"
                  + (f"  {gbs / (nominal * 1e3):.2f} of nominal {nominal} TB/s" if nominal
                     else "")
                  + (f", {gbs / figures['copy_gbs']:.2f} of a copy" if figures["copy_gbs"]
                     else ""))
    emit(args.json, "zeropp_kernels", figures, dry_run=args.dry_run)
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", action="store_true",
                   help="time the quantization kernels on one GPU instead (module doc)")
    p.add_argument("--numel", type=int, default=1 << 28, help="--kernels: elements quantized")
    p.add_argument("--json", default=None, help="--kernels: append the figures record here")
    p.add_argument("--dry-run", action="store_true", help="--kernels at a tiny size on CPU")
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=256)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="steps per contestant per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--contestants", default=",".join(CONTESTANTS))
    args = p.parse_args(argv)
    names = [n.strip() for n in args.contestants.split(",") if n.strip()]
    for name in names:
        if name not in CONTESTANTS:
            p.error(f"unknown contestant {name!r}; choose from {', '.join(CONTESTANTS)}")
    if "zero3" not in names:
        names.insert(0, "zero3")
    args.names = names
    return args


def _engine(args, extra):
    import deepspeed
    from gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.n_layer,
                          n_head=args.n_head, n_embd=args.n_embd))
    config = {"train_micro_batch_size_per_gpu": args.micro, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 1000,
                                    "reduce_bucket_size": 2_000_000, **extra}}
    if args.dtype == "bf16":
        config["bf16"] = {"enabled": True}
    return deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                config=config)[0]


def worker(args):
    from deepspeed import comm as dist
    from deepspeed.comms_logging import CommsLogger, CommsLoggerConfig
    from deepspeed.zero.zeropp.volume import blocks_of_nodes, volume

    rank, world = dist.get_rank(), dist.get_world_size()
    engines = {name: _engine(args, CONTESTANTS[name]) for name in args.names}
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, args.vocab, (64, args.micro, args.seq + 1), generator=g)
    cursor = {name: 0 for name in args.names}
    losses = {name: [] for name in args.names}

    def step(name):
        batch = data[(cursor[name] * world + rank) % len(data)]
        cursor[name] += 1
        engine = engines[name]
        loss = engine(batch[:, :-1], batch[:, 1:])
        engine.backward(loss)
        engine.step()
        losses[name].append(loss.item())

    volumes = {}
    for name in args.names:  # warm up, then one logged step each
        step(name)
        log = CommsLogger(CommsLoggerConfig(enabled=True))
        dist.add_comm_observer(log)
        step(name)
        dist.remove_comm_observer(log)
        vol = volume(log.summary(), rank, blocks_of_nodes(2))
        volumes[name] = (sum(v["total"] for v in vol.values()),
                         sum(v["cross_node"] for v in vol.values()))
    times = {name: [] for name in args.names}
    for r in range(args.rounds):
        order = args.names if r % 2 == 0 else list(reversed(args.names))
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                step(name)
            mean = torch.tensor([(time.perf_counter() - start) / args.steps])
            dist.all_reduce(mean, op=dist.ReduceOp.MAX)
            times[name].append(float(mean))
    numel = sum(p.ds_numel for p in engines["zero3"].module.parameters())
    for engine in engines.values():
        engine.destroy()
    return {"volumes": volumes, "times": times, "losses": losses, "numel": numel}


def report(args, result):
    base_t = statistics.median(result["times"]["zero3"])
    base_total, base_cross = result["volumes"]["zero3"]
    print(f"GPT {args.n_layer} layers x {args.n_embd} ({result['numel'] / 1e6:.1f}M parameters), "
          f"{args.dtype}, 4 gloo CPU ranks as 2 nodes x 2, micro-batch {args.micro} x {args.seq}, "
          f"{args.rounds} rounds x {args.steps} steps")
    print(f"{'contestant':<10} {'step ms':>9} {'x zero3':>8} {'MiB sent/step':>14} {'x zero3':>8} "
          f"{'MiB cross-node':>15} {'x zero3':>8} {'last loss':>10}")
    for name in args.names:
        t = statistics.median(result["times"][name])
        total, cross = result["volumes"][name]
        print(f"{name:<10} {t * 1e3:9.1f} {t / base_t:8.2f} {total / 2**20:14.2f} "
              f"{total / base_total:8.3f} {cross / 2**20:15.2f} {cross / base_cross:8.3f} "
              f"{result['losses'][name][-1]:10.4f}")
    print(f"cross-node volume reduction of zero++ vs ZeRO-3: "
          f"{base_cross / max(result['volumes'].get('zero++', (0, 1e-9))[1], 1e-9):.1f}x"
          if "zero++" in result["volumes"] else "")


def main(argv=None):
    args = parse_args(argv)
    if args.kernels:
        return kernels_main(args)
    from deepspeed.testing import run_distributed

    results = run_distributed(worker, world_size=4, args=(args,), timeout=3600,
                              env={"LOCAL_WORLD_SIZE": "2"}, fresh=True)
    report(args, results[0])


if __name__ == "__main__":
    main()
