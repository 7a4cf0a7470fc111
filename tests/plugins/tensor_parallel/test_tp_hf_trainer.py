"""The HF Trainer with ``"tensor_parallel": {"autotp_size": 2}`` (its ``tp_size``) runs under
``deepspeed --num_gpus 2``: both ranks train the split model with the losses of the same script
run as one plain process, and the model ``trainer.save_model`` wrote (gathered from the shards)
reloads with ``from_pretrained`` at full size and gives the trained model's logits. The
``examples/tensor_parallel`` script runs under the same launcher."""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from deepspeed.testing.distributed import find_free_port

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.timeout(600)

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
SCRIPT = str(HERE / "scripts" / "hf_trainer_autotp.py")


def _run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def test_hf_trainer_autotp_trains_saves_and_reloads(tmp_path):
    launcher = str(Path(sys.executable).parent / "deepspeed")
    # the launch and the single-process reference are independent: run them at the same time
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = [pool.submit(_run, [launcher, "--num_gpus", "2", "--master_port",
                                   str(find_free_port()), SCRIPT, str(tmp_path / "tp")]),
                pool.submit(_run, [sys.executable, SCRIPT, str(tmp_path / "ref"), "reference"])]
        for run in runs:
            run.result()
    result = json.loads((tmp_path / "tp" / "result.json").read_text())
    reference = json.loads((tmp_path / "ref" / "result.json").read_text())["losses"][0]
    assert result["tp_size"] == 2
    assert result["trained_q_proj"] == [16, 32] and result["reloaded_q_proj"] == [32, 32]
    assert len(reference) == 4
    for rank_losses in result["losses"]:
        torch.testing.assert_close(torch.tensor(rank_losses), torch.tensor(reference),
                                   rtol=1e-5, atol=1e-5)
    assert result["max_logit_diff"] < 1e-5
    assert os.listdir(tmp_path / "tp" / "final")


def test_example_trains_on_two_processes():
    launcher = str(Path(sys.executable).parent / "deepspeed")
    proc = subprocess.run([launcher, "--num_gpus", "2", "--master_port", str(find_free_port()),
                           "examples/tensor_parallel/train.py", "--tp", "2", "--steps", "40"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "tensor parallel 2 x data parallel 1; q_proj on this rank: (32, 64)" in out
    assert "saved the gathered model: q_proj (64, 64)" in out
    first, last = out.split("steps: 40 loss: ")[1].split()[0:3:2]
    assert float(last) < float(first) - 1.0
