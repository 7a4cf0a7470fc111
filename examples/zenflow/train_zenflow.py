"""The ZenFlow tutorial on the demo GPT: ZeRO-Offload, then ZenFlow with the tutorial's settings,
same initial weights and batches, on CPU or GPU.

    deepspeed --num_gpus 2 examples/zenflow/train_zenflow.py [--steps 1500] [--print_every 50]

The ZenFlow config is the tutorial's (stage 2, ``offload_optimizer`` on the CPU, ``topk_ratio``
0.05, "auto" selection, ``update_interval`` 4, ``overlap_step`` on). Rank 0 prints both loss
curves and the final loss of each (the mean of the last ``--window`` steps); the script fails
when ZenFlow ends more than ``--tolerance`` (5%) above ZeRO-Offload, or the replicas differ.
``tools/bench/zenflow_bench.py`` imports ``train`` to time the same loop.
"""
import argparse
import copy
import os
import sys
import time

import torch

import deepspeed
from deepspeed import comm as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import global_mean, positive_int, replicas_identical  # noqa: E402  (examples/)
from gpt import GPT, GPTConfig, MarkovTokens  # noqa: E402

MODEL = GPTConfig(vocab_size=32, block_size=32, n_layer=2, n_head=4, n_embd=64)

ZERO_OFFLOAD = {
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 1,
    "steps_per_print": 10 ** 9,
    "optimizer": {"type": "AdamW", "params": {"lr": 5e-3, "betas": [0.9, 0.95],
                                              "weight_decay": 0.0}},
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
}
TUTORIAL_ZENFLOW = {"topk_ratio": 0.05, "select_strategy": "auto", "select_interval": "auto",
                    "update_interval": 4, "full_warm_up_rounds": 0, "overlap_step": True}


def zenflow_config(base=ZERO_OFFLOAD, **zenflow):
    config = copy.deepcopy(base)
    config["zero_optimization"]["zenflow"] = dict(TUTORIAL_ZENFLOW, **zenflow)
    return config


def train(config, steps, model_config=MODEL, samples=4096, on_step=None):
    """Train a fresh GPT (seed 0) for ``steps`` steps; the per-step mean loss over ranks and the
    engine's final replica check. ``on_step(step, seconds)`` sees each step's time."""
    torch.manual_seed(0)
    model = GPT(model_config)
    data = MarkovTokens(samples=samples, seq_len=model_config.block_size,
                        vocab_size=model_config.vocab_size, seed=1234)
    engine, optimizer, loader, _ = deepspeed.initialize(model=model, training_data=data,
                                                        config=config)
    losses, world = [], dist.get_world_size()
    while len(losses) < steps:
        for x, y in loader:
            begin = time.perf_counter()
            loss = engine(x.to(engine.device), y.to(engine.device))
            engine.backward(loss)
            engine.step()
            if on_step is not None:
                on_step(len(losses), time.perf_counter() - begin)
            losses.append(global_mean(loss.item(), world))
            if len(losses) == steps:
                break
    if hasattr(optimizer, "flush"):
        optimizer.flush()  # ZenFlow: land the last background CPU step
    identical = replicas_identical(engine.module.parameters())
    engine.destroy()
    return losses, identical


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=positive_int, default=1500)
    parser.add_argument("--window", type=positive_int, default=50,
                        help="final loss = mean of the last N steps (default 50)")
    parser.add_argument("--print_every", type=positive_int, default=50)
    parser.add_argument("--tolerance", type=float, default=0.05)
    args = parser.parse_args()
    runs = {"ZeRO-Offload": train(ZERO_OFFLOAD, args.steps),
            "ZenFlow": train(zenflow_config(), args.steps)}
    if dist.get_rank() != 0:
        return
    print(f"{'step':>6}" + "".join(f"{name:>14}" for name in runs))
    for step in range(0, args.steps, args.print_every):
        print(f"{step + 1:>6}" + "".join(f"{losses[step]:>14.4f}" for losses, _ in runs.values()))
    final = {name: sum(losses[-args.window:]) / min(args.window, len(losses))
             for name, (losses, _) in runs.items()}
    ratio = final["ZenFlow"] / final["ZeRO-Offload"]
    print(f"final loss (mean of the last {args.window} steps): ZeRO-Offload "
          f"{final['ZeRO-Offload']:.4f}, ZenFlow {final['ZenFlow']:.4f} (ratio {ratio:.4f})")
    if not all(identical for _, identical in runs.values()):
        raise SystemExit("replicas differ")
    if ratio > 1 + args.tolerance:
        raise SystemExit(f"ZenFlow's loss is {100 * (ratio - 1):.1f}% above ZeRO-Offload's")


if __name__ == "__main__":
    main()
