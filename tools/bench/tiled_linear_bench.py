"""``deepspeed.zero.TiledLinear`` under ZeRO-3: the most parameter bytes gathered at once, and
the step time, for one large linear layer cut into 1, 4, 16 and 64 tiles.

    python tools/bench/tiled_linear_bench.py [--features 2048 --splits 1,2,4,8 --steps 5]

Runs on 2 gloo CPU ranks (``deepspeed.testing``'s pool). The peak is the ZeRO-3 parameter
coordinator's ``gathered_peak`` (elements of partitioned parameters whole or in flight at once,
counted by the engine, not estimated), shown in MiB of fp32 and as a ratio against the untiled
layer measured in the same run, for two prefetch budgets: none, and one tile of the finest
tiling (the next tile is gathered while one runs). The layer's parameters also train like an
``nn.Linear`` (checked, max abs difference printed). A tool, never a test.
"""
import argparse
import os
import time

import torch


def _measure(features, splits, prefetch, steps):
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.zero import TiledLinear

    torch.manual_seed(0)
    lin = torch.nn.Linear(features, features)
    model = torch.nn.Sequential(TiledLinear(features, features, in_splits=splits,
                                            out_splits=splits, init_linear=lin))
    config = {"train_micro_batch_size_per_gpu": 4, "zero_allow_untested_optimizer": True,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_prefetch_bucket_size": prefetch}}
    engine, *_ = deepspeed.initialize(model=model, config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    data = torch.randn(steps * 4 * world, features, generator=torch.Generator().manual_seed(1))
    reference = torch.optim.SGD(lin.parameters(), lr=0.01)
    times = []
    for step in range(steps):
        batch = data[step * 4 * world:(step + 1) * 4 * world]
        start = time.perf_counter()
        engine.backward(engine(batch[rank * 4:rank * 4 + 4]).pow(2).mean())
        engine.step()
        times.append(time.perf_counter() - start)
        lin(batch).pow(2).mean().backward()
        reference.step()
        reference.zero_grad()
    peak = next(engine.module.parameters()).ds_coordinator.gathered_peak
    probe = torch.randn(2, features)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        diff = float((engine.module(probe) - lin(probe)).abs().max())
    engine.destroy()
    slowest = torch.tensor([sorted(times)[len(times) // 2]])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return peak, float(slowest), diff


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=int, default=2048)
    parser.add_argument("--splits", default="1,2,4,8")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    from deepspeed.testing.distributed import run_distributed

    splits = [int(s) for s in args.splits.split(",")]
    finest = -(-args.features // splits[-1])
    budgets = {"none": 0, f"one {finest}x{finest} tile": finest * finest + finest}
    print(f"TiledLinear({args.features}, {args.features}) under ZeRO-3 on 2 gloo CPU ranks, "
          f"torch {torch.__version__}, load average {os.getloadavg()[0]:.2f} (shared machine)")
    for label, budget in budgets.items():
        print(f"prefetch budget: {label} ({budget} elements)")
        print(f"  {'tiles':>6s} {'peak gathered MiB':>18s} {'vs untiled':>10s} "
              f"{'median step ms':>15s} {'max |diff| vs nn.Linear':>24s}")
        base = None
        for k in splits:
            results = run_distributed(_measure, world_size=2, timeout=600,
                                      args=(args.features, k, budget, args.steps))
            peak, seconds, diff = results[0]
            base = base or peak
            print(f"  {k * k:6d} {peak * 4 / 2**20:18.2f} {peak / base:10.3f} "
                  f"{seconds * 1e3:15.1f} {max(r[2] for r in results):24.2e}")


if __name__ == "__main__":
    main()
