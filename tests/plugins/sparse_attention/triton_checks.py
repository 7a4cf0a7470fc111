"""The Triton kernels against the dense references of test_ops, in a process of their own:
``TRITON_INTERPRET=1`` must be set before Triton is imported, so on CPU the interpreter runs
them (slowly: small shapes only). ``python triton_checks.py [cpu|cuda]``; prints one line per
case and exits non-zero when any case differs."""
import sys

import torch

from test_ops import _close, _matmul_case, _softmax_case

CASES = [("matmul", mode, ta, tb, 16, torch.float32) for mode in ("sdd", "dsd", "dds")
         for ta in (False, True) for tb in (False, True)]
CASES += [("matmul", "sdd", False, True, 32, torch.float32), ("matmul", "dsd", False, False, 64, torch.float32),
          ("matmul", "dds", True, False, 32, torch.float16), ("matmul", "dsd", False, False, 16, torch.bfloat16)]
CASES += [("softmax", None, None, None, block, dtype) for block, dtype in
          ((16, torch.float32), (32, torch.float32), (16, torch.float16), (64, torch.bfloat16))]


# The interpreter's tl.dot is numpy's, which has no bfloat16: bf16 products are checked on GPU.
GPU_ONLY = [("matmul", "sdd", False, True, 16, torch.bfloat16)]

# The interpreter runs each program instance in Python, and the batch is a grid dimension, so
# on the CPU the twelve mode x transpose cases at block 16 run one sample and the others two:
# each mode and the softmax still index a second sample (whose offset is the same for a
# transposed operand: the batch dimension stays outermost). A GPU runs two everywhere.
ONE_SAMPLE_ON_CPU = set(CASES[:12]) | {CASES[16], CASES[18]}


def cases(device):
    interpreted = [c for c in CASES if not (c[0] == "matmul" and c[5] == torch.bfloat16)]
    return CASES + GPU_ONLY if device == "cuda" else interpreted


def main(device):
    failed = 0
    for case in cases(device):
        kind, mode, ta, tb, block, dtype = case
        z = 1 if device == "cpu" and case in ONE_SAMPLE_ON_CPU else 2
        if kind == "matmul":
            pairs = _matmul_case(mode, ta, tb, block, dtype, backend="triton", device=device, z=z)
        else:
            pairs = _softmax_case(block, dtype, backend="triton", device=device, z=z)
        name = f"{kind} {mode or ''} trans_a={ta} trans_b={tb} block={block} {dtype} batch={z}"
        try:
            for got, want in pairs:
                _close(got, want, dtype)
            print(f"ok {name}")
        except AssertionError as err:
            failed += 1
            print(f"FAIL {name}: {err}")
    return failed


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1] if len(sys.argv) > 1 else "cpu") else 0)
