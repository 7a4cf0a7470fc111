"""Test-side probe of the Triton interpreter, shared by every suite with Triton kernel checks."""
import os
import subprocess
import sys


def interpreter_problem():
    """Why this environment's Triton interpreter cannot run the kernels, or None: asked in a
    process with ``TRITON_INTERPRET=1`` (read when Triton is imported). Some Triton releases'
    interpreters break on the installed NumPy (see ``triton_support.interpreter_problem``);
    that is not the kernels' fault, and the native GPU tests still run them."""
    code = "from deepspeed.ops.triton_support import interpreter_problem as p; print(p() or '')"
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"the Triton interpreter probe failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout.strip() or None
