"""The ZeRO++ and MixZ++ tutorials as a runnable example: the README demo's GPT under ZeRO-3
with ZeRO++'s communication optimizations, or with a LoRA-style frozen base stored quantized.

    deepspeed --num_gpus 2 examples/zeropp/train.py                       # ZeRO++ (qwZ + qgZ)
    deepspeed --num_gpus 4 examples/zeropp/train.py --hpz 2               # + hpZ, 2 "nodes" x 2
    deepspeed --num_gpus 2 examples/zeropp/train.py --mixz                # MixZ++ (LoRA)

ZeRO++ needs no change to the training code: the flags live in ``zero_optimization``
(``ds_zeropp_config.json``: ``zero_quantized_weights``, ``zero_quantized_gradients``;
``--hpz N`` sets ``zero_hpz_partition_size``, which should be the GPUs per node, and leaves it
unset for one node). On one machine ``--hpz 2`` with 4 processes builds the groups a 2-node
job would have. With ``comms_logger`` on, rank 0 prints the communication summary at the end.

``--mixz`` follows the MixZ++ tutorial: low-rank adapters are added to every Linear of the
blocks and the base weights frozen; with ``zero_quantized_nontrainable_weights`` the engine
stores the frozen shards as int8 at ``initialize``. (When the LoRA conversion runs after
``initialize``, call ``model.optimizer.quantize_nontrainable_params()``, as the tutorial says.)
The script exits non-zero unless the loss fell.
"""
import argparse
import json
import os
import sys

import torch
from torch import nn

import deepspeed
from deepspeed import comm as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from common import global_mean, positive_int  # noqa: E402
from gpt import GPT, GPTConfig, MarkovTokens  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=positive_int, default=150)
    parser.add_argument("--print_every", type=positive_int, default=25)
    parser.add_argument("--hpz", type=positive_int, default=1,
                        help="zero_hpz_partition_size: ranks per node (default 1: off)")
    parser.add_argument("--mixz", action="store_true",
                        help="MixZ++: LoRA adapters on a frozen base stored as int8")
    parser.add_argument("--lora-rank", type=positive_int, default=4)
    deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class LoRALinear(nn.Module):
    """``base(x) + up(down(x))``: the frozen base Linear plus a trainable low-rank update
    (the "custom LoRA conversion" the tutorial leaves to the user)."""

    def __init__(self, base, rank):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.down = nn.Linear(base.in_features, rank, bias=False)
        self.up = nn.Linear(rank, base.out_features, bias=False)
        nn.init.zeros_(self.up.weight)

    def forward(self, x):
        return self.base(x) + self.up(self.down(x))


def convert_to_lora(model, rank):
    for block in model.blocks:
        for parent in (block.attn, block.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, LoRALinear(child, rank))
    model.wte.requires_grad_(False)
    model.wpe.requires_grad_(False)
    return model


def main():
    args = parse_args()
    name = "ds_mixz_config.json" if args.mixz else "ds_zeropp_config.json"
    config = args.deepspeed_config or os.path.join(HERE, name)
    with open(config) as f:
        config = json.load(f)
    if args.hpz > 1:
        config["zero_optimization"]["zero_hpz_partition_size"] = args.hpz
    deepspeed.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, block_size=32, n_layer=2, n_head=4, n_embd=64))
    if args.mixz:
        model = convert_to_lora(model, args.lora_rank)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=config)
    data = MarkovTokens(samples=4096, seq_len=32)
    micro = engine.train_micro_batch_size_per_gpu()
    first = last = None
    for step in range(args.steps):
        start = ((step * world + rank) * micro) % (len(data) - micro)
        batch = data.tokens[start:start + micro]
        loss = engine(batch[:, :-1], batch[:, 1:])
        engine.backward(loss)
        engine.step()
        mean = global_mean(loss.item(), world)
        first = mean if first is None else first
        last = mean
        if rank == 0 and (step % args.print_every == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {mean:.4f}", flush=True)
    if config.get("comms_logger", {}).get("enabled"):
        dist.log_summary()
    engine.destroy()
    if rank == 0:
        print(f"loss {first:.3f} -> {last:.3f} (chain entropy {data.entropy:.3f})")
    if not last < first:
        raise SystemExit("the loss did not fall")


if __name__ == "__main__":
    main()
