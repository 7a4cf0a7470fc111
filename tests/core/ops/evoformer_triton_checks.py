"""The Evoformer Triton kernels against the naive reference, in a process of their own:
``TRITON_INTERPRET=1`` must be set before Triton is imported, so on CPU the interpreter runs them.
``python evoformer_triton_checks.py [cpu|cuda]``; one line per case, non-zero exit on a failure."""
import sys

import torch

from evoformer_cases import compare
from triton_check_runner import check_all


def cases(device):
    # the interpreter's tl.dot is numpy's, which has no bfloat16: bf16 is checked on GPU
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
    return [(name, dtype) for name in ("row", "column", "triangle") for dtype in dtypes]


if __name__ == "__main__":
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    check_all(cases(device), lambda name, dtype: compare(name, dtype, device=device, backend="triton"))
