"""``ds_elastic``: prints the config's elastic section and the plan the engine would compute, for
the plan alone and for one world size; a bad world size or config is a clear exit message."""
import json

import pytest

import deepspeed
from deepspeed.elasticity import compute_elastic_config
from deepspeed.elasticity.cli import main

SECTION = {"enabled": True, "max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6],
           "min_gpus": 1, "max_gpus": 10000, "min_time": 20, "version": 0.1}


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "elasticity": SECTION}))
    return str(path)


def _value(out, key):
    line = next(line for line in out.splitlines() if line.startswith(key + " "))
    return line.rpartition(" ")[2] if key != "valid_gpus" else line.split(" .... ", 1)[1].strip(". ")


def test_plan_for_a_world_size(config_file, capsys):
    assert main(["-c", config_file, "-w", "4"]) == 0
    out = capsys.readouterr().out
    batch, gpus, micro = compute_elastic_config({"elasticity": SECTION}, deepspeed.__version__, 4)
    assert "Calculated results for world size 4:" in out
    assert json.loads(out.split("Elasticity config:\n", 1)[1].split("\n---", 1)[0].split("\n", 1)[1]) == SECTION
    assert int(_value(out, "final_batch_size")) == batch == 1680
    assert int(_value(out, "micro_batch_size")) == micro
    assert f"valid_gpus .......... {gpus}" in out


def test_plan_without_world_size(config_file, capsys):
    assert main(["--config", config_file]) == 0
    out = capsys.readouterr().out
    assert "Calculated results:" in out and "micro_batch_size ...." not in out
    assert "final_batch_size .... 1680" in out


def test_invalid_world_size_and_missing_section(config_file, tmp_path):
    with pytest.raises(SystemExit, match="world size 9 is not valid"):
        main(["-c", config_file, "-w", "9"])
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    with pytest.raises(SystemExit, match="no 'elasticity' section"):
        main(["-c", str(plain)])
    with pytest.raises(SystemExit, match="cannot read the config"):
        main(["-c", str(tmp_path / "missing.json")])
