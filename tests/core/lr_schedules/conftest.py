"""Fixtures for the LR schedule tests: small optimizers and a capture of DeepSpeed's warnings.

The DeepSpeed logger does not propagate to the root logger (so `caplog` misses it); the
`ds_warnings` fixture attaches a handler to it directly.
"""
import logging

import pytest
import torch

from deepspeed.utils.logging import logger


def make_optimizer(kind="adam", lrs=(0.1,), **kwargs):
    """One parameter group per entry of `lrs`, each with its own base lr."""
    groups = [{"params": [torch.nn.Parameter(torch.ones(3) * (i + 1))], "lr": lr}
              for i, lr in enumerate(lrs)]
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[kind]
    return cls(groups, lr=lrs[0], **kwargs)


def train_step(optimizer):
    """A real optimizer step, so the values the schedule writes are the ones torch consumes."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.full_like(p, 0.5)
    optimizer.step()


@pytest.fixture
def ds_warnings():
    records = []

    class _Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = _Collect(level=logging.WARNING)
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


@pytest.fixture
def make_opt():
    return make_optimizer


@pytest.fixture
def train():
    return train_step
