"""Small helpers the example scripts share (``train_demo.py``, ``moe/train.py``,
``pipeline/train.py``, ...); nothing here is DeepSpeed API, only the scripts' own plumbing."""
import argparse
import importlib.util
import os
import sys

import torch

from deepspeed import comm as dist


EXTRA_INSTALL = "pip install -c constraints.txt -e '.[examples]'"


def _installed(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module set to None
        return False


def require(*modules):
    """Stop with the install command when packages this example imports are missing (the core
    install does not bring them; the ``examples`` extra does), instead of an ImportError."""
    missing = [name for name in modules if not _installed(name)]
    if missing:
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "this example"
        raise SystemExit(f"{script} needs {', '.join(missing)}, which "
                         f"{'is' if len(missing) == 1 else 'are'} not installed; install the "
                         f"examples' extra from the repository root: {EXTRA_INSTALL}")


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
