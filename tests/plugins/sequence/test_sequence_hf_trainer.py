"""ALST through the HF Trainer and Accelerate 1.15's ``ParallelismConfig(sp_backend="deepspeed",
sp_size=2)``: the example script, launched by ``deepspeed --num_gpus 2``, trains a tiny Llama
(4 query heads, 1 kv head) with Ulysses x ZeRO-3 x activation checkpointing and gives the losses
of plain single-process training on the same sequence."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deepspeed.testing.distributed import find_free_port

pytest.importorskip("transformers", reason="transformers is a dev extra")
pytest.importorskip("accelerate", reason="accelerate is a dev extra")
pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "examples" / "sequence" / "hf_trainer_alst.py"


def test_trainer_with_accelerate_sp_equals_single_process(tmp_path):
    launcher = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    assert launcher, "the deepspeed console script is not installed"
    proc = subprocess.run([launcher, "--num_gpus", "2", "--master_port", str(find_free_port()),
                           str(SCRIPT), str(tmp_path)], capture_output=True, text=True,
                          timeout=500, cwd=ROOT, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "alst_losses.json").read_text())
    assert result["sp_world_size"] == 2 and result["zero_stage"] == 3
    assert len(result["alst"]) == len(result["single_process"]) == 4
    assert result["alst"] == pytest.approx(result["single_process"], rel=1e-5)
