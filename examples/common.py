"""Small helpers the example scripts share (``train_demo.py``, ``moe/train.py``,
``pipeline/train.py``); nothing here is DeepSpeed API, only the scripts' own plumbing."""
import argparse

import torch

from deepspeed import comm as dist


def positive_int(text):
    """An ``argparse`` type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def global_mean(value, world):
    """The mean over ranks of a local float (a collective: every rank must call it)."""
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / world


def replicas_identical(params):
    """Whether ``params`` hold the same values on every rank (a collective), compared through
    a checksum of their sums."""
    checksum = torch.stack([p.detach().double().sum() for p in params]).sum()
    high, low = checksum.clone(), checksum.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return bool((high - low).abs() < 1e-9)
