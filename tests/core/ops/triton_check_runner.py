"""Runs a ``*_triton_checks.py`` script of this folder in a fresh interpreter (Triton reads
``TRITON_INTERPRET`` when it is imported) and checks that every case it lists printed ``ok``;
``check_all`` is those scripts' main loop."""
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deepspeed.ops.triton_support import triton_status
from deepspeed.testing.triton import interpreter_problem

HERE = Path(__file__).parent
needs_triton = pytest.mark.skipif(not triton_status()[0], reason=f"{triton_status()[1]}")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device: the native Triton run needs a GPU")


def run_checks(module, device, interpret):
    if interpret and (why := interpreter_problem()):
        pytest.skip(why)
    env = dict(os.environ, TRITON_INTERPRET="1" if interpret else "0")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(HERE / f"{module}.py"), device], env=env,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cases = importlib.import_module(module).cases(device)
    assert sum(line.startswith("ok ") for line in proc.stdout.splitlines()) == len(cases), proc.stdout


def check_all(cases, check):
    """Run ``check(*case)`` for every case, print ``ok``/``FAIL`` per case, exit 1 on a failure."""
    failed = 0
    for case in cases:
        name = " ".join(str(c) for c in case)
        try:
            check(*case)
            print(f"ok {name}")
        except AssertionError as err:
            failed += 1
            print(f"FAIL {name}: {err}")
    sys.exit(1 if failed else 0)
