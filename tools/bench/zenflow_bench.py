"""ZenFlow step time against ZeRO-Offload (ZeRO-2, optimizer on the CPU), with and without
``overlap_step``, on the demo GPT (2 gloo ranks on CPU, or whatever accelerator is present).

    python tools/bench/zenflow_bench.py [--n_layer 4 --n_embd 256 --rounds 5 --steps 8]

All three contestants live in one process pair (same initial weights, same batches) and take
turns, ``--steps`` steps each per round, the order flipping every round. A turn's time includes
landing ZenFlow's last background CPU step (``flush``), so overlap is not credited with work
left running; the figure is the median over rounds of the slowest rank's mean step time, and
every ratio is against ZeRO-Offload measured in the same run. ZenFlow uses the tutorial's
settings (``topk_ratio`` 0.05, ``update_interval`` 4, "auto" selection). On a CPU-only machine
the "device" part of ZenFlow runs on the same cores as its background thread, so the overlap
has little to hide behind: the win there is stepping the CPU optimizer every 4th step only.
It is a tool, never a test: nothing here asserts on time.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "examples"), str(HERE.parents[1] / "examples" / "zenflow"),
                str(HERE)]

CONTESTANTS = ("ZeRO-Offload", "ZenFlow", "ZenFlow+overlap")


def _configs():
    from train_zenflow import ZERO_OFFLOAD, zenflow_config

    return {"ZeRO-Offload": ZERO_OFFLOAD, "ZenFlow": zenflow_config(overlap_step=False),
            "ZenFlow+overlap": zenflow_config(overlap_step=True)}


def _race(model_args, rounds, steps, micro):
    """On each rank: per contestant, the mean step time of each round."""
    import deepspeed
    from deepspeed import comm as dist
    from gpt import GPT, GPTConfig, MarkovTokens

    model_config = GPTConfig(**model_args)
    data = MarkovTokens(samples=micro * 2 * (rounds * steps + 4), seq_len=model_config.block_size,
                        vocab_size=model_config.vocab_size, seed=1234)
    engines = {}
    for name, config in _configs().items():
        config = dict(config, train_micro_batch_size_per_gpu=micro)
        torch.manual_seed(0)
        engine, optimizer, loader, _ = deepspeed.initialize(model=GPT(model_config),
                                                            training_data=data, config=config)
        engines[name] = (engine, optimizer, iter(loader))
        for _ in range(2):  # warm-up: the first selection, first CPU step, allocator
            _one_step(*engines[name])
        _flush(optimizer)
    times = {name: [] for name in CONTESTANTS}
    for r in range(rounds):
        order = CONTESTANTS if r % 2 == 0 else CONTESTANTS[::-1]
        for name in order:
            engine, optimizer, batches = engines[name]
            dist.barrier()
            begin = time.perf_counter()
            for _ in range(steps):
                _one_step(engine, optimizer, batches)
            _flush(optimizer)
            times[name].append((time.perf_counter() - begin) / steps)
    for engine, _, _ in engines.values():
        engine.destroy()
    return times


def _one_step(engine, optimizer, batches):
    x, y = next(batches)
    engine.backward(engine(x.to(engine.device), y.to(engine.device)))
    engine.step()


def _flush(optimizer):
    if hasattr(optimizer, "flush"):
        optimizer.flush()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n_layer", type=int, default=4)
    parser.add_argument("--n_embd", type=int, default=256)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="steps per turn (default 8: two "
                        "ZenFlow CPU updates)")
    args = parser.parse_args(argv)
    from deepspeed.testing.distributed import run_distributed

    model_args = dict(vocab_size=256, block_size=64, n_layer=args.n_layer, n_head=8,
                      n_embd=args.n_embd)
    out = run_distributed(_race, world_size=2, timeout=3000,
                          args=(model_args, args.rounds, args.steps, args.micro))
    # the slowest rank of each round, then the median over rounds
    figures = {name: statistics.median(max(rank[name][r] for rank in out)
                                       for r in range(args.rounds)) for name in CONTESTANTS}
    base = figures["ZeRO-Offload"]
    print(f"# GPT n_layer={args.n_layer} n_embd={args.n_embd} (micro {args.micro} x seq 64), "
          f"2 ranks, {args.rounds} rounds x {args.steps} steps, median of the slowest rank")
    print(f"{'contestant':<18} {'s/step':>8} {'vs ZeRO-Offload':>16}")
    for name in CONTESTANTS:
        print(f"{name:<18} {figures[name]:>8.4f} {base / figures[name]:>15.2f}x")


if __name__ == "__main__":
    import zenflow_bench  # ranks find the workers by module name, not __main__

    zenflow_bench.main()
