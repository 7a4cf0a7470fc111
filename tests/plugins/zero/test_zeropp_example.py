"""examples/zeropp/train.py through the real ``deepspeed`` launcher: ZeRO++ with hpZ on 4
processes as 2 "nodes" x 2, and the MixZ++ (LoRA) variant on 2. The script exits non-zero
unless the loss fell (10 steps: 3.502 -> 3.377 with hpZ, 3.513 -> 3.470 with MixZ++; the runs
are deterministic)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deepspeed.testing.distributed import find_free_port

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("procs, flags, expect", [
    (4, ["--hpz", "2"], "all_to_all_single"),  # qgZ ran, and comms_logger printed it
    (2, ["--mixz"], "loss 3."),
], ids=["zeropp-hpz", "mixz"])
def test_the_example_trains(procs, flags, expect):
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    cmd = [launcher, "--num_gpus", str(procs), "--master_port", str(find_free_port()),
           "examples/zeropp/train.py", "--steps", "10", *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT,
                          env=dict(os.environ))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert expect in out and " -> " in out
