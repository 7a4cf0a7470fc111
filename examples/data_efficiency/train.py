"""The data-efficiency tutorials as a runnable example: the README demo's GPT trained with the
legacy seqlen curriculum and random-LTD through ``deepspeed.initialize``.

    deepspeed --num_gpus 2 examples/data_efficiency/train.py [--steps 300]
              [--deepspeed_config examples/data_efficiency/ds_config.json]

- ``curriculum_learning`` (seqlen, fixed_linear 8 -> 32 over 120 steps): the GPT's forward takes
  no ``curriculum_seqlen`` keyword, so the engine truncates ``(idx, targets)`` to the current
  difficulty in each training forward;
- ``data_efficiency.data_routing.random_ltd``: ``convert_to_random_ltd(engine, Block)`` wraps
  the 4 transformer blocks; blocks 1 and 2 process a random, growing subset of the tokens
  (8 -> 32 over 200 steps, the kept positions sorted so causal attention still holds) and the
  others pass through the whole sequence.

Rank 0 prints the loss, the curriculum's sequence length and random-LTD's kept length as they
grow, and the layer tokens consumed against the dense count. Exits non-zero unless the loss fell.
"""
import argparse
import json
import math
import os
import sys
import time

import torch

import deepspeed
from deepspeed import comm as dist
from deepspeed.data_efficiency import convert_to_random_ltd, remove_random_ltd_state_dict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from common import global_mean, positive_int, replicas_identical  # noqa: E402
from gpt import GPT, Block, GPTConfig, MarkovTokens  # noqa: E402

MODEL = GPTConfig(vocab_size=32, block_size=32, n_layer=4, n_head=4, n_embd=64)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=positive_int, default=300)
    parser.add_argument("--print_every", type=positive_int, default=50)
    deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main():
    args = parse_args()
    config = args.deepspeed_config or os.path.join(HERE, "ds_config.json")
    torch.manual_seed(0)
    model = GPT(MODEL)
    data = MarkovTokens(samples=8192, seq_len=MODEL.block_size, vocab_size=MODEL.vocab_size,
                        seed=1234)
    engine, _, loader, _ = deepspeed.initialize(model=model, training_data=data, config=config)
    convert_to_random_ltd(engine, Block)
    rank, world = dist.get_rank(), dist.get_world_size()
    first = last = None
    window, count, start = 0.0, 0, time.perf_counter()
    while engine.global_steps < args.steps:
        for x, y in loader:
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            window, count = window + loss.item(), count + 1
            step = engine.global_steps
            if step == 1 or step % args.print_every == 0 or step == args.steps:
                last = global_mean(window / count, world)
                first = last if first is None else first
                window, count = 0.0, 0
                if rank == 0:
                    print(f"step {step:4d}: loss {last:.4f}  curriculum seqlen "
                          f"{engine.curriculum_scheduler_legacy.get_current_difficulty():2d}  "
                          f"random-LTD kept {engine.random_ltd_scheduler.get_current_seq():2d}  "
                          f"({time.perf_counter() - start:5.1f} s)", flush=True)
            if step >= args.steps:
                break
    ltd = engine.random_ltd_scheduler
    dense = engine.global_steps * engine.train_batch_size() * ltd.max_value * ltd.total_layer_num
    identical = replicas_identical(engine.module.parameters())
    plain_keys = set(GPT(MODEL).state_dict())
    stripped = set(remove_random_ltd_state_dict(engine.module.state_dict()))
    if rank == 0:
        print("=" * 60)
        print(f"world size {world}; steps {engine.global_steps}; loss {first:.4f} -> {last:.4f}")
        print(f"layer tokens consumed {ltd.consumed_layer_tokens:,} of {dense:,} dense "
              f"({100 * (1 - ltd.consumed_layer_tokens / dense):.1f}% saved by random-LTD)")
        print(f"replicas identical: {identical}; stripped state dict matches the plain GPT: "
              f"{stripped == plain_keys}")
        print("=" * 60)
    if last >= first or not identical or stripped != plain_keys:
        raise SystemExit("data-efficiency example failed (see the summary above)")


if __name__ == "__main__":
    main()
