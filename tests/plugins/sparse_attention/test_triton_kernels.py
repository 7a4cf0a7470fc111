"""The Triton kernels (MatMul in all modes and transposes, Softmax with every mask) equal the
dense references: under the Triton interpreter on CPU, natively on a GPU when there is one."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deepspeed.sparse_attention.backend import triton_status
from deepspeed.testing.triton import interpreter_problem

HERE = Path(__file__).parent
needs_triton = pytest.mark.skipif(not triton_status()[0], reason=f"{triton_status()[1]}")


def _run(device, interpret):
    if interpret and (why := interpreter_problem()):
        pytest.skip(why)
    env = dict(os.environ, TRITON_INTERPRET="1" if interpret else "0")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(HERE / "triton_checks.py"), device], env=env,
                          capture_output=True, text=True, timeout=280)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from triton_checks import cases

    assert sum(line.startswith("ok ") for line in lines) == len(cases(device)), proc.stdout


@needs_triton
def test_triton_kernels_under_the_interpreter():
    _run("cpu", interpret=True)


@needs_triton
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the native Triton run needs a GPU")
def test_triton_kernels_on_gpu():
    _run("cuda", interpret=False)


def test_forcing_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    from deepspeed.sparse_attention.backend import kernels_for

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="needs a CUDA tensor, or the Triton interpreter|triton is not installed"):
        kernels_for(torch.zeros(1), "triton")


def test_forcing_triton_under_a_broken_interpreter_says_why(monkeypatch):
    from deepspeed.ops import triton_support
    from deepspeed.sparse_attention import backend

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(backend, "triton_status", lambda: (True, "3.6.0"))
    monkeypatch.setattr(triton_support, "interpreter_problem", lambda: "numpy refuses int() of arrays")
    with pytest.raises(RuntimeError, match="'triton' on a cpu tensor: numpy refuses int"):
        backend.kernels_for(torch.zeros(1), "triton")
