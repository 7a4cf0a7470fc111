"""A plain HF Trainer script runs on this package through `deepspeed --num_gpus 2` (issue 9's
first step: train and save under ZeRO-2 and ZeRO-3)."""
import json
import os

import pytest

from test_cli import HERE, free_port, run, script

pytest.importorskip("transformers", reason="transformers is a dev extra")
pytest.importorskip("accelerate", reason="accelerate is a dev extra")


@pytest.mark.parametrize("stage", [2, 3])
def test_trainer_trains_and_saves(tmp_path, stage):
    out = run([script("deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()),
               str(HERE / "scripts" / "hf_trainer_tiny.py"), str(tmp_path), str(stage)],
              timeout=300)
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert len(result["losses"]) == 4 and all(loss > 0 for loss in result["losses"])
    checkpoint = tmp_path / "checkpoint-4"
    assert (checkpoint / "latest").read_text().strip() == "global_step4"
    assert (checkpoint / "zero_to_fp32.py").exists()
    assert any(name.endswith("_optim_states.pt")
               for name in os.listdir(checkpoint / "global_step4"))
    assert (tmp_path / "final").is_dir()
