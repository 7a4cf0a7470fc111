"""A plain HF Trainer script runs on this package through `deepspeed --num_gpus 2` (issue 9):
ZeRO-2, ZeRO-3 and ZeRO-2 with CPU optimizer offload train, save, resume and convert, and agree
with the same script run without DeepSpeed (plain DDP under torchrun).

The three DeepSpeed configurations train one after the other in a single `deepspeed` launch and
the DDP reference in one `torchrun` launch (module fixture, shared by the assertions); under
DeepSpeed each configuration also resumes from its step-4 checkpoint (see the script). The two
launches run at the same time since each is dominated by process start-up and imports."""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from test_cli import HERE, free_port, run, script

pytest.importorskip("transformers", reason="transformers is a dev extra")
pytest.importorskip("accelerate", reason="accelerate is a dev extra")

# the shared fixture's four launches are charged to the first test; 300 s is too tight for them
# on a loaded two-core machine
pytestmark = pytest.mark.timeout(600)

SCRIPT = str(HERE / "scripts" / "hf_trainer_tiny.py")
# ZeRO-3 last: a later configuration then cannot depend on anything ZeRO-3 leaves in the process
ZERO_MODES = ["z2", "z2_offload", "z3"]
STEPS = 8


def launch(root, modes):
    if modes == ["ddp"]:
        cmd = [script("torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port())]
    else:
        cmd = [script("deepspeed"), "--num_gpus", "2", "--master_port", str(free_port())]
    run(cmd + [SCRIPT, str(root), ",".join(modes)], timeout=500)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_trainer")
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(launch, root, modes) for modes in (["ddp"], ZERO_MODES)]:
            future.result()
    return root


def losses(folder):
    """{rank: (first step, [loss of each step])}, the exact per-rank losses the script kept."""
    found = {}
    for rank in range(2):
        record = json.loads((folder / f"losses_rank{rank}.json").read_text())
        found[rank] = (record["first_step"], record["losses"])
    return found


@pytest.mark.parametrize("mode", ZERO_MODES)
def test_trainer_trains_and_saves_a_zero_checkpoint(runs, mode):
    for step in (4, STEPS):
        checkpoint = runs / mode / f"checkpoint-{step}"
        assert (checkpoint / "latest").read_text().strip() == f"global_step{step}"
        assert (checkpoint / "zero_to_fp32.py").exists()
        optim_files = [n for n in os.listdir(checkpoint / f"global_step{step}")
                       if n.endswith("_optim_states.pt")]
        assert len(optim_files) == 2
    for first, values in losses(runs / mode).values():
        assert first == 1 and len(values) == STEPS


@pytest.mark.parametrize("mode", ZERO_MODES)
def test_losses_match_plain_ddp(runs, mode):
    # the DeepSpeed "AdamW" is torch's AdamW on ZeRO-2/3 and DeepSpeedCPUAdam under offload
    reference = losses(runs / "ddp")
    for rank, (first, values) in losses(runs / mode).items():
        assert first == reference[rank][0]
        torch.testing.assert_close(torch.tensor(values, dtype=torch.float64),
                                   torch.tensor(reference[rank][1], dtype=torch.float64),
                                   rtol=1e-4, atol=0)


@pytest.mark.parametrize("mode", ZERO_MODES)
def test_resume_from_step_4_continues_the_same_losses(runs, mode):
    uninterrupted = losses(runs / mode)
    for rank, (first, values) in losses(runs / mode / "resumed").items():
        assert first == 5 and len(values) == STEPS - 4
        torch.testing.assert_close(torch.tensor(values, dtype=torch.float64),
                                   torch.tensor(uninterrupted[rank][1][4:], dtype=torch.float64),
                                   rtol=1e-5, atol=0)


@pytest.mark.parametrize("mode", ZERO_MODES)
def test_zero_to_fp32_of_the_trainer_checkpoint_rebuilds_the_trained_model(runs, mode):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = runs / mode
    checkpoint = folder / f"checkpoint-{STEPS}"
    target = folder / "consolidated.bin"
    proc = subprocess.run([sys.executable, str(checkpoint / "zero_to_fp32.py"), str(checkpoint),
                           str(target)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state_dict = torch.load(target, weights_only=True)
    # HF ties lm_head.weight to transformer.wte.weight; the checkpoint records it as an alias and
    # the converter writes it out, so a strict load needs no special handling
    assert torch.equal(state_dict["lm_head.weight"], state_dict["transformer.wte.weight"])
    model = GPT2LMHeadModel(GPT2Config.from_json_file(folder / "model_config.json"))
    model.load_state_dict(state_dict, strict=True)
    model.eval()
    probe = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(0))[:4]
    with torch.no_grad():
        logits = model(input_ids=probe).logits
    trained = torch.load(folder / "logits.pt", weights_only=True)
    torch.testing.assert_close(logits, trained, rtol=1e-6, atol=1e-6)
    # and the consolidated model is the one plain DDP trained, to fp32 accumulation noise
    ddp_logits = torch.load(runs / "ddp" / "logits.pt", weights_only=True)
    torch.testing.assert_close(logits, ddp_logits, rtol=1e-4, atol=1e-4)
