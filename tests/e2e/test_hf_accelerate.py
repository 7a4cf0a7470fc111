"""`accelerate launch` with an Accelerate DeepSpeed config runs a plain Trainer script on this
package (issue 9): accelerate imports `deepspeed.launcher.runner.DEEPSPEED_ENVIRONMENT_NAME`,
starts the ranks itself through torchrun and then drives `deepspeed.initialize` from the
Trainer, so nothing in the script names DeepSpeed."""
import json
import os

import pytest

from test_cli import HERE, free_port, run, script

pytest.importorskip("transformers", reason="transformers is a dev extra")
pytest.importorskip("accelerate", reason="accelerate is a dev extra")

COMMON = """compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
num_processes: 2
num_machines: 1
machine_rank: 0
use_cpu: true
"""
# the accelerate config carries the ZeRO settings itself
INLINE_STAGE2 = COMMON + """mixed_precision: 'no'
deepspeed_config:
  zero_stage: 2
  gradient_accumulation_steps: 1
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: false
"""
# the accelerate config points at a DeepSpeed JSON (accelerate then forbids mixed_precision here)
FILE_STAGE3 = COMMON + """deepspeed_config:
  deepspeed_config_file: {ds_json}
  zero3_init_flag: false
"""
DS_JSON = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "gradient_clipping": "auto", "zero_optimization": {"stage": 3},
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}}


@pytest.mark.parametrize("variant", ["inline_stage2", "file_stage3"])
def test_accelerate_launch_trains_and_saves(tmp_path, variant):
    if variant == "inline_stage2":
        config, stage = INLINE_STAGE2, 2
    else:
        ds_json = tmp_path / "ds_config.json"
        ds_json.write_text(json.dumps(DS_JSON))
        config, stage = FILE_STAGE3.format(ds_json=ds_json), 3
    (tmp_path / "accelerate.yaml").write_text(config)
    out_dir = tmp_path / "out"
    out = run([script("accelerate"), "launch", "--config_file", str(tmp_path / "accelerate.yaml"),
               "--main_process_port", str(free_port()),
               str(HERE / "scripts" / "hf_accel_trainer.py"), str(out_dir)], timeout=300)
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert result["engine"] == "deepspeed.engine.DeepSpeedEngine"
    assert result["zero_stage"] == stage and result["world"] == 2
    assert len(result["losses"]) == 8 and all(0 < loss < 10 for loss in result["losses"])
    checkpoint = out_dir / "checkpoint-8"
    assert (checkpoint / "latest").read_text().strip() == "global_step8"
    assert (checkpoint / "zero_to_fp32.py").exists()
    names = set(os.listdir(checkpoint / "global_step8"))
    assert {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "zero_pp_rank_1_mp_rank_00_optim_states.pt"} <= names
    if stage == 2:  # ZeRO-2 keeps whole weights on every rank, so HF also writes safetensors
        assert (checkpoint / "model.safetensors").exists()
