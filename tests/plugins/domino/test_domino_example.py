"""``examples/domino/train.py`` under the ``deepspeed`` launcher on 2 CPU processes: TP 2,
the loss falls (the script exits non-zero otherwise) and the traced step had all-reduces in
flight while other compute ran."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from deepspeed.testing.distributed import find_free_port

ROOT = Path(__file__).resolve().parents[3]


def test_example_trains_domino_on_two_processes():
    launcher = shutil.which("deepspeed", path=os.path.dirname(sys.executable)) or "deepspeed"
    proc = subprocess.run([launcher, "--num_gpus", "2", "--master_port", str(find_free_port()),
                           "examples/domino/train.py", "--steps", "12"], cwd=ROOT,
                          capture_output=True, text=True, timeout=280)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Domino: tensor parallel 2 x data parallel 1, 2 pieces per batch; " \
           "query_key_value on this rank: (96, 64)" in out, out
    found = re.search(r"last step: (\d+) all-reduces, (\d+) of them in flight", out)
    assert found and int(found[1]) == 16 and int(found[2]) >= 8, out
