"""Data efficiency: the offline DataAnalyzer's throughput, and random-LTD's step-time saving
against the theoretical saving of the layer-token formula.

    python tools/bench/data_efficiency_bench.py [--samples 1000000] [--seq 1024] [--keep 512]

1. **DataAnalyzer** (map + reduce) over ``--samples`` synthetic samples whose metric is a token
   count (one ``single_value_per_sample`` metric, int64, batch 10,000), with 1 worker and with 2
   workers (two map processes at once, as two nodes would run them; one thread each), then the
   reduce that writes the four index files. Samples/s = samples / (map + reduce wall time).
2. **random-LTD**: a 12-layer decoder (GPT blocks of ``examples/gpt.py``, width ``--width``,
   ``--heads`` heads) at sequence ``--seq``, batch ``--batch``; forward + backward of the whole
   stack, dense against random-LTD on layers 1..10 keeping ``--keep`` tokens. The theoretical
   saving is ``1 - (keep*10 + seq*2) / (seq*12)`` (layer tokens, the formula random-LTD's
   scheduler counts); attention's quadratic part makes the real saving of a dropped token a bit
   larger, the gather/scatter a bit smaller. Medians of ``--steps`` steps after warm-up,
   contestants alternating. Nothing here asserts on time.
"""
import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))


class SyntheticTokens(torch.utils.data.Dataset):
    """Sample i: its token count (the metric), from a fixed pseudo-random draw in [1, 2048]."""

    def __init__(self, n):
        self.counts = torch.from_numpy(np.random.default_rng(0).integers(1, 2049, size=n))

    def __len__(self):
        return len(self.counts)

    def __getitem__(self, i):
        return self.counts[i]


def token_count(batch):
    return batch


def _analyzer(ds, path, workers, worker):
    from deepspeed.data_efficiency import DataAnalyzer

    return DataAnalyzer(ds, num_workers=workers, worker_id=worker, num_threads=1,
                        batch_size=10000, metric_names=["tokens"], metric_functions=[token_count],
                        metric_types=["single_value_per_sample"], metric_dtypes=[np.int64],
                        save_path=path, show_progress=False)


def _map(ds, path, workers, worker):
    _analyzer(ds, path, workers, worker).run_map()


def bench_analyzer(samples, workers):
    ds = SyntheticTokens(samples)
    with tempfile.TemporaryDirectory() as path:
        start = time.perf_counter()
        context = multiprocessing.get_context("fork")
        procs = [context.Process(target=_map, args=(ds, path, workers, w)) for w in range(workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise RuntimeError("a map worker failed")
        mapped = time.perf_counter()
        _analyzer(ds, path, workers, 0).run_reduce()
        done = time.perf_counter()
    return mapped - start, done - mapped


def bench_random_ltd(args):
    from gpt import Block, GPTConfig

    from deepspeed.data_efficiency import RandomLTDScheduler, convert_to_random_ltd
    from deepspeed.data_efficiency.config import RandomLTDConfig

    layers, ltd_ids = 12, list(range(1, 11))
    cfg = GPTConfig(vocab_size=32, block_size=args.seq, n_layer=layers, n_head=args.heads,
                    n_embd=args.width)
    torch.manual_seed(0)
    dense = torch.nn.Sequential(*[Block(cfg) for _ in range(layers)])
    ltd = convert_to_random_ltd(torch.nn.Sequential(*[Block(cfg) for _ in range(layers)]), Block)
    config = RandomLTDConfig(enabled=True, total_layer_num=layers, random_ltd_layer_num=10,
                             random_ltd_layer_id=ltd_ids, random_ltd_schedule={
                                 "min_value": args.keep, "max_value": args.seq,
                                 "schedule_config": {"require_steps": 10 ** 9,
                                                     "seq_per_step": 8}})
    scheduler = RandomLTDScheduler(config)
    for i, wrapper in enumerate(ltd):
        wrapper.init_config(config, scheduler, i)
    x = torch.randn(args.batch, args.seq, args.width)

    def step(model):
        for p in model.parameters():
            p.grad = None
        start = time.perf_counter()
        model(x).square().mean().backward()
        return time.perf_counter() - start

    for _ in range(2):
        step(dense), step(ltd)
    times = {"dense": [], "ltd": []}
    for i in range(args.steps):
        order = [("dense", dense), ("ltd", ltd)][:: 1 if i % 2 else -1]
        for name, model in order:
            times[name].append(step(model))
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--keep", type=int, default=512)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    print(f"DataAnalyzer, {args.samples:,} samples, metric = token count:")
    for workers in (1, 2):
        mapped, reduced = bench_analyzer(args.samples, workers)
        print(f"  {workers} worker(s): map {mapped:6.2f} s, reduce {reduced:5.2f} s -> "
              f"{args.samples / (mapped + reduced):,.0f} samples/s "
              f"(map alone {args.samples / mapped:,.0f} samples/s)")
    medians = bench_random_ltd(args)
    theory = 1 - (args.keep * 10 + args.seq * 2) / (args.seq * 12)
    print(f"random-LTD, 12 layers (10 LTD), seq {args.seq}, keep {args.keep}, width "
          f"{args.width}, batch {args.batch}, fwd+bwd median of {args.steps}:")
    print(f"  dense {medians['dense'] * 1e3:7.1f} ms, random-LTD {medians['ltd'] * 1e3:7.1f} ms "
          f"-> saving {100 * (1 - medians['ltd'] / medians['dense']):.1f}% "
          f"(theoretical from layer tokens {100 * theory:.1f}%)")


if __name__ == "__main__":
    main()
