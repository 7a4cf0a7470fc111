"""``GPU_CHECK_DRY_RUN=1 bash tools/gpu_check.sh``: the script a GPU lease runs, run here at tiny
sizes on the CPU, so a bench that would crash on the GPU machine crashes here first. Every
default step must end ``ok`` (its benchmark's dry run) or be skipped with a reason; every
benchmark must leave a dry-run figures record; the summary files must exist and name the
steps. About a minute on an idle 2-core machine (seven benchmark processes)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEPS = ("fused_adam", "inference", "zero_offload", "transformer", "sparse_attention",
         "evoformer", "zeropp_kernels", "tests")
BENCHES = {"fused_adam", "fused_lamb", "inference", "zero_offload", "transformer_kernel",
           "sparse_attention", "evoformer", "zeropp_kernels"}


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="needs bash and coreutils' timeout")
@pytest.mark.timeout(900)
def test_gpu_check_dry_run_runs_every_step_or_says_why_not(tmp_path):
    env = dict(os.environ, GPU_CHECK_DRY_RUN="1", OUT=str(tmp_path), PYTHON=sys.executable)
    env.pop("GPU_CHECK_ONLY", None)
    env.pop("GPU_CHECK_SKIP", None)
    proc = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=880)
    log = (tmp_path / "steps.log").read_text() if (tmp_path / "steps.log").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split("\t") for line in (tmp_path / "steps.tsv").read_text().splitlines()]
    status = {row[0]: row[4] for row in rows}
    assert tuple(status) == STEPS, status
    for name, state in status.items():
        assert state == "ok" or state.startswith("skipped: "), (name, state, log[-4000:])
    assert status["tests"].startswith("skipped: GPU tests")
    records = [json.loads(line) for line in (tmp_path / "figures.jsonl").read_text().splitlines()]
    assert {r["bench"] for r in records} == BENCHES
    assert all(r["dry_run"] and r["figures"] for r in records)
    summary = (tmp_path / "summary.md").read_text()
    assert all(f"| {name} |" in summary for name in STEPS)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"]
    # what the lease returns: at most 8 files, none left mid-step
    assert len(list(tmp_path.iterdir())) <= 8 and not (tmp_path / "current_step.txt").exists()
