"""The compression example trains through the ``deepspeed`` launcher on 2 CPU ranks."""
import os
import subprocess
import sys
from pathlib import Path

from deepspeed.testing.distributed import find_free_port

ROOT = Path(__file__).resolve().parents[3]


def test_example_compresses_cleans_and_reloads(tmp_path):
    launcher = Path(sys.executable).parent / "deepspeed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(launcher), "--num_gpus", "2", "--master_port", str(find_free_port()),
                           str(ROOT / "examples" / "compression" / "train.py"),
                           "--steps", "120", "--save_dir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "intermediate.dense 64x64 (from 64x128)" in out
    assert "weight bits 6" in out  # the 8 -> 6 schedule ran
    assert (tmp_path / "cleaned_int8.pt").stat().st_size < (tmp_path / "cleaned.pt").stat().st_size
