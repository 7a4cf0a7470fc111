"""The Evoformer Triton kernels against the naive reference, in a process of their own:
``TRITON_INTERPRET=1`` must be set before Triton is imported, so on CPU the interpreter runs them.
``python evoformer_triton_checks.py [cpu|cuda]``; one line per case, non-zero exit on a failure."""
import sys

import torch

from evoformer_cases import compare
from triton_check_runner import check_all


# The interpreter runs each program instance in Python (~30 ms apiece; a kernel's grid is
# query tiles x batch x rows x heads), so on the CPU the column and triangle variants are
# checked at shapes with fewer rows: the column one with 6 (3 keys: one partial tile), the
# triangle one at 18 residues (a full 16-wide tile, a partial one, two key tiles) with one head.
# The row variant keeps the defaults and with them the two heads (the per-head pair bias).
# The code paths are those of the default shapes; a GPU checks the defaults of all three.
INTERPRETER_SHAPES = {"row": {}, "column": {"n_res": 6}, "triangle": {"n_res": 18, "heads": 1}}


def cases(device):
    # the interpreter's tl.dot is numpy's, which has no bfloat16: bf16 is checked on GPU
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
    return [(name, dtype) for name in ("row", "column", "triangle") for dtype in dtypes]


def check(name, dtype, device):
    shape = INTERPRETER_SHAPES[name] if device == "cpu" else {}
    compare(name, dtype, device=device, backend="triton", **shape)


if __name__ == "__main__":
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    check_all(cases(device), lambda name, dtype: check(name, dtype, device))
