"""The pipeline-parallelism tutorial as a runnable example: an AlexNet-style CNN written as a list
of ``LayerSpec``s, split into pipeline stages and trained with ``engine.train_batch()``.

    deepspeed --num_gpus 2 examples/pipeline/train.py [--stages 2] [--steps 50]
              [--training_data] [--deepspeed_config examples/pipeline/ds_config.json]

On this CPU machine the launcher starts 2 processes (gloo): with ``--stages 2`` each one holds
half of the network (layers are built only on the rank that owns them), activations go forward
and their gradients backward between the two stages, and each ``train_batch()`` runs
``gradient_accumulation_steps`` micro-batches of ``train_micro_batch_size_per_gpu`` images. With
4 processes and 2 stages the two pipelines also train data-parallel.

The data are synthetic 3x32x32 images: each of 10 classes is a fixed random pattern, every image
its class's pattern plus noise, so the loss falls from ln(10) = 2.30 within a few dozen steps.
By default the script builds its own loader and hands ``train_batch`` an iterator over a
``deepspeed.utils.RepeatingLoader`` (the engine pulls exactly gradient_accumulation_steps
micro-batches per call, so the stream must never run dry mid-batch); ``--training_data`` gives
the dataset to ``deepspeed.initialize`` instead, and ``train_batch()`` then reads it itself.
"""
import argparse
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import deepspeed
from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.utils import RepeatingLoader

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from common import positive_int  # noqa: E402  (the examples' shared helpers)

NUM_CLASSES = 10


class SyntheticImages(Dataset):
    """``(image, label)`` pairs: class ``c``'s smooth random pattern (the same for every data
    set) plus Gaussian noise drawn from ``seed``: the same ``seed`` gives the same images on
    every rank, another seed a held-out set of the same classes."""

    def __init__(self, samples=4096, size=32, noise=2.0, seed=1234):
        coarse = torch.randn(NUM_CLASSES, 3, size // 8, size // 8,
                             generator=torch.Generator().manual_seed(0))
        patterns = nn.functional.interpolate(coarse, size=(size, size), mode="bilinear",
                                             align_corners=False)
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, NUM_CLASSES, (samples,), generator=g)
        self.images = patterns[self.labels] + noise * torch.randn(samples, 3, size, size,
                                                                  generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        return self.images[idx], self.labels[idx]


class AlexNetPipe(PipelineModule):
    """A small AlexNet (features, adaptive pooling, flatten, classifier) expressed only with
    ``LayerSpec``s: ``nn.ReLU(inplace=True)`` becomes ``LayerSpec(nn.ReLU, inplace=True)``, and
    the flatten is a plain lambda (any callable is a layer)."""

    def __init__(self, num_classes=NUM_CLASSES, **kwargs):
        specs = [
            LayerSpec(nn.Conv2d, 3, 32, kernel_size=5, stride=2, padding=2),
            LayerSpec(nn.ReLU, inplace=True),
            LayerSpec(nn.MaxPool2d, kernel_size=2),
            LayerSpec(nn.Conv2d, 32, 64, kernel_size=3, padding=1),
            LayerSpec(nn.ReLU, inplace=True),
            LayerSpec(nn.MaxPool2d, kernel_size=2),
            LayerSpec(nn.Conv2d, 64, 96, kernel_size=3, padding=1),
            LayerSpec(nn.ReLU, inplace=True),
            LayerSpec(nn.Conv2d, 96, 64, kernel_size=3, padding=1),
            LayerSpec(nn.ReLU, inplace=True),
            LayerSpec(nn.AdaptiveAvgPool2d, (2, 2)),
            lambda x: torch.flatten(x, 1),
            LayerSpec(nn.Dropout, p=0.1),
            LayerSpec(nn.Linear, 64 * 2 * 2, 128),
            LayerSpec(nn.ReLU, inplace=True),
            LayerSpec(nn.Linear, 128, num_classes),
        ]
        super().__init__(layers=specs, loss_fn=nn.CrossEntropyLoss(), **kwargs)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("-p", "--stages", type=positive_int, default=2,
                        help="pipeline stages; must divide the number of processes (default 2)")
    parser.add_argument("--steps", type=positive_int, default=50,
                        help="train_batch() calls (default 50)")
    parser.add_argument("--training_data", action="store_true",
                        help="pass the dataset to deepspeed.initialize and let train_batch() "
                             "read it, instead of handing it a RepeatingLoader iterator")
    parser.add_argument("--seed", type=int, default=1138)
    deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main():
    args = parse_args()
    deepspeed.init_distributed()  # the module needs the process grid to partition its layers
    torch.manual_seed(args.seed)
    net = AlexNetPipe(num_stages=args.stages, partition_method="parameters")
    train_set, eval_set = SyntheticImages(seed=1234), SyntheticImages(samples=512, seed=4321)
    config = args.deepspeed_config or os.path.join(HERE, "ds_config.json")
    engine, _, _, _ = deepspeed.initialize(
        model=net, model_parameters=[p for p in net.parameters() if p.requires_grad],
        training_data=train_set if args.training_data else None, config=config)

    # each data-parallel replica reads its own shard; only the first stage (images) and the last
    # (labels) use what they read
    dp_world = engine.grid.get_data_parallel_world_size()
    dp_rank = engine.grid.get_data_parallel_rank()

    def loader(dataset, shuffle):
        sampler = DistributedSampler(dataset, num_replicas=dp_world, rank=dp_rank,
                                     shuffle=shuffle, seed=args.seed)
        return DataLoader(dataset, batch_size=engine.train_micro_batch_size_per_gpu(),
                          sampler=sampler, drop_last=True)

    train_iter = None if args.training_data else iter(RepeatingLoader(loader(train_set, True)))
    rank0 = deepspeed.comm.get_rank() == 0
    if rank0:
        print(f"pipeline of {engine.num_stages} stages x {dp_world} data-parallel; a batch is "
              f"{engine.gradient_accumulation_steps()} micro-batches of "
              f"{engine.train_micro_batch_size_per_gpu()} images per replica "
              f"({engine.train_batch_size()} in all)", flush=True)

    first = last = None
    for step in range(1, args.steps + 1):
        loss = engine.train_batch(data_iter=train_iter)  # the same mean loss on every rank
        last = loss.item()
        first = last if first is None else first
        if rank0 and (step == 1 or step % 10 == 0 or step == args.steps):
            print(f"step {step:4d}: train loss {last:.4f}", flush=True)

    eval_loss = engine.eval_batch(iter(RepeatingLoader(loader(eval_set, False)))).item()
    if rank0:
        print(f"train loss {first:.4f} -> {last:.4f}; eval loss {eval_loss:.4f} "
              f"(ln {NUM_CLASSES} = 2.3026)", flush=True)
    engine.destroy()
    if last >= first:
        raise SystemExit(f"loss did not fall: {first:.4f} -> {last:.4f}")


if __name__ == "__main__":
    main()
