"""The Trainer's "auto" values reach our engine filled as Transformers documents them, and
explicit values that disagree with TrainingArguments stop the run with the documented error
(checklist hf-integration 1.2). One process, started the notebook way (no launcher)."""
import json
import os
import sys

import pytest

from test_cli import HERE, free_port, run

pytest.importorskip("transformers", reason="transformers is a dev extra")
pytest.importorskip("accelerate", reason="accelerate is a dev extra")


@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    out = run([sys.executable, str(HERE / "scripts" / "hf_auto_config.py"),
               str(tmp_path_factory.mktemp("hf_auto"))],
              # the scripts' folder added to PYTHONPATH, not in its place: the suite's entries
              # (the warm-interpreter client) stay
              env={"MASTER_PORT": str(free_port()),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE / "scripts"),
                                                               os.environ.get("PYTHONPATH")]))},
              timeout=280)
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.splitlines()
             if line.startswith(("AUTO ", "MISMATCH "))}
    return {"auto": json.loads(lines["AUTO"]), "mismatch": lines["MISMATCH"]}


def test_auto_values_are_filled_from_the_trainer_arguments_and_model(printed):
    """world 1, per-device 4, GAS 3, lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0.01, clip 1.0,
    warmup 0.1 of 95 steps, hidden size 16 (the checklist's worked example, on one rank)."""
    seen = printed["auto"]
    assert seen["engine"] == "deepspeed.engine.DeepSpeedEngine"
    assert seen["train_batch_size"] == 12 and seen["train_micro_batch_size_per_gpu"] == 4
    assert seen["gradient_accumulation_steps"] == 3 and seen["gradient_clipping"] == 1.0
    assert seen["betas"] == [0.9, 0.999] and seen["eps"] == 1e-8
    assert seen["weight_decay"] == 0.01
    assert seen["warmup_min_lr"] == 0 and seen["warmup_max_lr"] == 1e-3
    assert seen["warmup_num_steps"] == 10 and seen["total_num_steps"] == 95
    assert seen["reduce_bucket_size"] == 16 * 16
    assert seen["stage3_prefetch_bucket_size"] == 230  # int(0.9 * 16 * 16)
    assert seen["stage3_param_persistence_threshold"] == 160


def test_explicit_values_that_disagree_raise_the_documented_error(printed):
    message = json.loads(printed["mismatch"])
    assert "mismatch TrainingArguments values" in message
    assert "ds train_micro_batch_size_per_gpu=5 vs hf per_device_train_batch_size=4" in message
    assert "ds optimizer.params.lr=0.5 vs hf learning_rate=0.001" in message
    assert "gradient_accumulation_steps" not in message  # 3 == 3 is no mismatch
