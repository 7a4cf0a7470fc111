"""The Evoformer Triton kernels against the naive reference, in a process of their own:
``TRITON_INTERPRET=1`` must be set before Triton is imported, so on CPU the interpreter runs them.
``python evoformer_triton_checks.py [cpu|cuda]``; one line per case, non-zero exit on a failure."""
import sys

import torch

from evoformer_cases import compare


def cases(device):
    # the interpreter's tl.dot is numpy's, which has no bfloat16: bf16 is checked on GPU
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
    return [(name, dtype) for name in ("row", "column", "triangle") for dtype in dtypes]


def main(device):
    failed = 0
    for name, dtype in cases(device):
        try:
            compare(name, dtype, device=device, backend="triton")
            print(f"ok {name} {dtype}")
        except AssertionError as err:
            failed += 1
            print(f"FAIL {name} {dtype}: {err}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
