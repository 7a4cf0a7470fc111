"""The README demo: data-parallel training through `deepspeed.initialize` on CPU processes.

    deepspeed --num_gpus 2 examples/train_demo.py

Each rank trains on its own shard of a synthetic, learnable regression task (y = W x + noise);
gradients are averaged across ranks, so the replicas stay identical. Rank 0 prints the loss
falling and a summary of the run (world, backend, accelerator, enabled plugins).
"""
import argparse

import torch

import deepspeed
from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator

CONFIG = {
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 1,
    "steps_per_print": 50,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
}


def make_data(samples=2048, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(dim, 1, generator=g)
    x = torch.randn(samples, dim, generator=g)
    y = x @ w + 0.01 * torch.randn(samples, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--epochs", type=int, default=2)
    deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(0)  # same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    config = args.deepspeed_config or CONFIG
    engine, _, loader, _ = deepspeed.initialize(model=model, training_data=make_data(),
                                                config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    first = last = None
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(engine(x.to(engine.device)), y.to(engine.device))
            engine.backward(loss)
            engine.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            mean = mean.item() / world
            first = mean if first is None else first
            last = mean
        if rank == 0:
            print(f"epoch {epoch}: step {engine.global_steps}, mean loss {last:.4f}", flush=True)

    # replicas must agree: compare a checksum of the weights across ranks
    checksum = torch.stack([p.detach().double().sum() for p in engine.module.parameters()]).sum()
    spread = checksum.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    low = checksum.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    plugins = sorted(name for name, _ in engine.plugins.list_name_plugin()) or ["none"]
    if rank == 0:
        print("=" * 60)
        print(f"deepspeed {deepspeed.__version__} demo summary")
        print(f"  world size        : {world} (backend {dist.get_backend()})")
        print(f"  accelerator       : {get_accelerator()._name}")
        print(f"  enabled plugins   : {', '.join(plugins)}")
        print(f"  optimizer steps   : {engine.global_steps} x {engine.train_batch_size()} samples")
        print(f"  loss              : {first:.4f} -> {last:.4f}")
        print(f"  replicas identical: {bool((spread - low).abs() < 1e-9)}")
        print("=" * 60)
    if last >= first:
        raise SystemExit(f"loss did not fall: {first:.4f} -> {last:.4f}")


if __name__ == "__main__":
    main()
