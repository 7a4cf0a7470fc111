"""The Triton bias-GeLU kernel against ``F.gelu(y + bias)``, in a process of its own
(``TRITON_INTERPRET=1`` must be set before Triton is imported). ``python bias_gelu_checks.py
[cpu|cuda]``; prints one line per case, exits non-zero when one differs."""
import sys

import torch
import torch.nn.functional as F


def main(device):
    from deepspeed.inference.triton_bias_gelu import triton_bias_gelu

    failed = 0
    for tanh in (False, True):
        for shape, dtype in (((3, 5, 40), torch.float32), ((7, 33), torch.float32),
                             ((4, 64), torch.float16)):
            if dtype is torch.float16 and device == "cpu":
                continue
            g = torch.Generator().manual_seed(0)
            y = torch.randn(shape, generator=g).to(device, dtype)
            b = torch.randn(shape[-1], generator=g).to(device, dtype)
            want = F.gelu(y.float() + b.float(), approximate="tanh" if tanh else "none")
            got = triton_bias_gelu(y, b, tanh).float()
            tol = 1e-5 if dtype is torch.float32 else 2e-3
            ok = torch.allclose(got, want, atol=tol, rtol=tol)
            failed += not ok
            print(f"{'ok' if ok else 'FAIL'} tanh={tanh} {shape} {dtype}")
    return failed


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1] if len(sys.argv) > 1 else "cpu") else 0)
