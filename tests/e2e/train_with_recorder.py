"""Worker script: a short training run whose config enables the third-party call recorder."""
import os
import sys

import torch

import deepspeed

record_dir = sys.argv[-1]
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
engine, *_ = deepspeed.initialize(model=model, config={
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    "call_recorder": {"record_file": f"{record_dir}/rank{os.environ['RANK']}.jsonl"},
})
for _ in range(4):
    loss = engine(torch.randn(2, 4)).pow(2).mean()
    engine.backward(loss)
    engine.step()
