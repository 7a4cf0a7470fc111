"""The data-efficiency example trains through the ``deepspeed`` launcher on 2 CPU ranks."""
import os
import subprocess
import sys
from pathlib import Path

from deepspeed.testing.distributed import find_free_port

ROOT = Path(__file__).resolve().parents[3]


def test_example_trains_with_curriculum_and_random_ltd():
    launcher = Path(sys.executable).parent / "deepspeed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(launcher), "--num_gpus", "2", "--master_port", str(find_free_port()),
                           str(ROOT / "examples" / "data_efficiency" / "train.py"),
                           "--steps", "160", "--print_every", "40"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "replicas identical: True" in out
    assert "curriculum seqlen 32" in out  # the curriculum reached the full length
    assert "saved by random-LTD" in out
