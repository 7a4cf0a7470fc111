"""``examples/inference/generate.py`` (the inference tutorial, runnable) under the
``deepspeed`` launcher on 2 CPU processes: T5 split over both, weights loaded from the
tutorial's ``ds_model`` checkpoint JSON, tokens equal to the single-process model."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from deepspeed.testing.distributed import find_free_port

ROOT = Path(__file__).resolve().parents[3]


def test_example_generates_the_single_process_tokens_on_two_processes():
    launcher = shutil.which("deepspeed", path=os.path.dirname(sys.executable)) or "deepspeed"
    proc = subprocess.run([launcher, "--num_gpus", "2", "--master_port", str(find_free_port()),
                           "examples/inference/generate.py", "--model", "t5"], cwd=ROOT,
                          capture_output=True, text=True, timeout=280)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for rank in (0, 1):
        assert f"rank {rank}/2: t5 tp_size=2 fp32" in out, out
    assert out.count("tokens equal single-process: True") == 2, out
