"""Elastic training of the demo GPT: the job survives workers leaving and joining.

    deepspeed --elastic_training --no_ssh --node_rank 0 --num_gpus 1 \\
        --min_elastic_nodes 1 --max_elastic_nodes 2 examples/elasticity/train.py --steps 40
    # and, on the other "node" (another terminal), the same with --node_rank 1

The config's ``elasticity`` section fixes the global batch at 16 samples for 1 or 2 workers
(micro-batch 4: 4 accumulation steps on one worker, 2 on two). Every optimizer step draws its
global batch from a generator seeded by the step number and each rank trains its own slice of
it, so the optimisation does not depend on how many workers share the batch. A checkpoint is
written every ``--save_every`` steps; after any restart (a worker died, or a new one joined) the
script resumes from the latest one. Rank 0 appends one JSON line per step to ``--log``.
"""
import argparse
import json
import os
import sys
import time

import torch

import deepspeed
from deepspeed import comm as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gpt import GPT, GPTConfig  # noqa: E402  (the examples' shared model)

MODEL = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=32)
CONFIG = {
    "elasticity": {"enabled": True, "max_train_batch_size": 16, "micro_batch_sizes": [2, 4],
                   "min_gpus": 1, "max_gpus": 2, "version": 0.1},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
    "steps_per_print": 10 ** 6,
}


def global_batch(step, size):
    """The ``size`` samples of optimizer step ``step`` (the same whoever trains them)."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, MODEL.vocab_size, (size, MODEL.block_size + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps in all")
    parser.add_argument("--save_dir", default="elastic_checkpoints")
    parser.add_argument("--save_every", type=int, default=2)
    parser.add_argument("--log", default=None, help="JSON lines, one per step (rank 0)")
    parser.add_argument("--step_sleep", type=float, default=0.0,
                        help="seconds to pause after each step (to watch a restart happen)")
    return parser.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(0)
    engine, *_ = deepspeed.initialize(model=GPT(MODEL), config=CONFIG)
    rank, world = dist.get_rank(), dist.get_world_size()
    if os.path.isfile(os.path.join(args.save_dir, "latest")):
        engine.load_checkpoint(args.save_dir)
    resumed_from = engine.global_steps
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    while engine.global_steps < args.steps:
        x, y = global_batch(engine.global_steps, engine.train_batch_size())
        for i in range(gas):  # this rank's micro-batches of the global batch
            start = (i * world + rank) * micro
            loss = engine(x[start:start + micro], y[start:start + micro])
            engine.backward(loss)
            engine.step()
        if engine.global_steps % args.save_every == 0 or engine.global_steps == args.steps:
            engine.save_checkpoint(args.save_dir)
        if rank == 0 and args.log:
            with open(args.log, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({
                    "step": engine.global_steps, "world": world, "loss": loss.item(),
                    "train_batch_size": engine.train_batch_size(), "micro": micro, "gas": gas,
                    "resumed_from": resumed_from,
                    "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}) + "\n")
        time.sleep(args.step_sleep)
    if rank == 0:
        print(f"done: {engine.global_steps} steps of {engine.train_batch_size()} samples on "
              f"{world} worker(s)", flush=True)
        torch.save(engine.module.state_dict(), os.path.join(args.save_dir, "final_model.pt"))


if __name__ == "__main__":
    main()
