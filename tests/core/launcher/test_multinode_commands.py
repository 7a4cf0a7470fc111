"""The multi-node commands' worker wrapping: rank_guard around MPI/srun-started workers only, and
srun's --kill-on-bad-exit, checked on the --dry_run output."""
import shlex

import pytest

from deepspeed.launcher import launch, runner


class CpuAccelerator:
    name = "cpu"

    def device_count(self):
        return 1

    def device_name(self, device_index=None):
        return "cpu"

    def visible_devices_envs(self):
        return ["CUDA_VISIBLE_DEVICES"]


@pytest.fixture
def hostfile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DS_ENV_FILE", raising=False)
    monkeypatch.setattr(runner, "_accelerator", CpuAccelerator)
    monkeypatch.setattr(launch, "visible_devices_envs", CpuAccelerator().visible_devices_envs)
    path = tmp_path / "hostfile"
    path.write_text("node-a slots=1\nnode-b slots=1\n")
    return str(path)


def command(capsys, *argv):
    assert runner.main(["--dry_run", *argv]) == 0, capsys.readouterr().err
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line and not line.startswith(("export ", "#", "["))]
    return shlex.split(lines[0])


GUARD = ["-u", "-m", "deepspeed.launcher.rank_guard", "--"]


@pytest.mark.parametrize("launcher", ["openmpi", "mpich", "impi", "slurm", "mvapich"])
def test_workers_started_by_the_launcher_run_behind_rank_guard(capsys, hostfile, launcher):
    cmd = command(capsys, "-H", hostfile, "--launcher", launcher, "train.py", "--deepspeed")
    at = cmd.index("deepspeed.launcher.rank_guard")
    assert cmd[at - 2:at + 2] == GUARD and cmd[at + 2].startswith("/")  # then python, the script
    assert cmd[at + 3:at + 5] == ["-u", "train.py"] and cmd[-1] == "--deepspeed"


def test_pdsh_runs_the_per_node_launcher_without_a_guard(capsys, hostfile):
    cmd = command(capsys, "-H", hostfile, "train.py")
    assert "deepspeed.launcher.rank_guard" not in " ".join(cmd)
    assert "deepspeed.launcher.launch" in cmd[-1]


def test_venv_script_wraps_the_guard(capsys, hostfile):
    cmd = command(capsys, "-H", hostfile, "--launcher", "mpich", "--venv_script", "/opt/env.sh",
                  "train.py")
    assert cmd[-3:-1] == ["bash", "-c"]
    assert cmd[-1].startswith(". /opt/env.sh && exec ") and "deepspeed.launcher.rank_guard" in cmd[-1]


def test_srun_ends_the_step_when_a_rank_fails(capsys, hostfile):
    cmd = command(capsys, "-H", hostfile, "--launcher", "slurm",
                  "--launcher_args=--kill-on-bad-exit=0", "train.py")
    # ours first, so a user's --launcher_args setting (srun: the last one wins) overrides it
    assert cmd.index("--kill-on-bad-exit=1") < cmd.index("--kill-on-bad-exit=0") < cmd.index("-m")
