"""The README demo: a small GPT trained data-parallel through `deepspeed.initialize` on CPU.

    deepspeed --num_gpus 2 examples/train_demo.py [--epochs N] [--steps N] [--print_every N]

The data is a synthetic token stream from a fixed random second-order Markov chain
(`gpt.MarkovTokens`), so the loss has somewhere to fall: from ln(vocab) towards the chain's
entropy, within a few hundred steps. Each rank reads its own shard through the engine's loader,
the engine averages gradients across ranks, so the replicas stay identical. Rank 0 prints the
loss as it falls and a summary of the run (world, backend, accelerator, enabled plugins).
"""
import argparse
import math
import os
import sys
import time

import torch

import deepspeed
from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import global_mean, positive_int, replicas_identical  # noqa: E402  (siblings)
from gpt import GPT, GPTConfig, MarkovTokens  # noqa: E402

MODEL = GPTConfig(vocab_size=32, block_size=32, n_layer=2, n_head=4, n_embd=64)

CONFIG = {
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 1,
    "steps_per_print": 250,  # the engine's own progress line (lr, samples/sec), twice a run
    "optimizer": {"type": "AdamW",
                  "params": {"lr": 5e-3, "betas": [0.9, 0.95], "weight_decay": 0.0}},
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--epochs", type=positive_int, default=2,
                        help="passes over the synthetic data set (default 2)")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help="stop after this many optimizer steps (default: run all epochs)")
    parser.add_argument("--samples", type=positive_int, default=8192,
                        help="size of the synthetic data set (default 8192)")
    parser.add_argument("--print_every", type=positive_int, default=100,
                        help="rank 0 prints the mean loss every N steps (default 100)")
    deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(0)  # same initial weights on every rank
    model = GPT(MODEL)
    data = MarkovTokens(samples=args.samples, seq_len=MODEL.block_size,
                        vocab_size=MODEL.vocab_size, seed=1234)
    config = args.deepspeed_config or CONFIG
    engine, _, loader, _ = deepspeed.initialize(model=model, training_data=data, config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"GPT {sum(p.numel() for p in model.parameters()):,} parameters; loss starts near "
              f"ln({MODEL.vocab_size}) = {math.log(MODEL.vocab_size):.2f}, the data's floor is "
              f"about {data.entropy:.2f}", flush=True)

    first = last = None
    window, window_steps = 0.0, 0
    start = time.perf_counter()
    done = False
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = engine(x.to(engine.device), y.to(engine.device))
            engine.backward(loss)
            engine.step()
            window += loss.item()
            window_steps += 1
            done = args.steps is not None and engine.global_steps >= args.steps
            if engine.global_steps % args.print_every == 0 or done or engine.global_steps == 1:
                last = global_mean(window / window_steps, world)
                first = last if first is None else first
                window, window_steps = 0.0, 0
                if rank == 0:
                    print(f"epoch {epoch} step {engine.global_steps:4d}: loss {last:.4f} "
                          f"({time.perf_counter() - start:5.1f} s)", flush=True)
            if done:
                break
        if done:
            break
    if window_steps:  # the tail of the last epoch since the last print
        last = global_mean(window / window_steps, world)
        first = last if first is None else first

    identical = replicas_identical(engine.module.parameters())  # replicas must agree
    plugins = sorted(name for name, _ in engine.plugins.list_name_plugin()) or ["none"]
    if rank == 0:
        print(f"summary (deepspeed {deepspeed.__version__}):")
        print(f"  world size        : {world} (backend {dist.get_backend()})")
        print(f"  accelerator       : {get_accelerator()._name}")
        print(f"  enabled plugins   : {', '.join(plugins)}")
        print(f"  optimizer steps   : {engine.global_steps} x {engine.train_batch_size()} samples")
        print(f"  loss              : {first:.4f} -> {last:.4f}")
        print(f"  replicas identical: {identical}")
        print(f"  wall time         : {time.perf_counter() - start:.1f} s")
    if last >= first:
        raise SystemExit(f"loss did not fall: {first:.4f} -> {last:.4f}")


if __name__ == "__main__":
    main()
