"""What the per-node launcher gives each worker, computed without starting anything."""
import signal
import subprocess
import sys

import pytest

from deepspeed.launcher import launch
from deepspeed.launcher.hostfile import encode_world_info

WORLD = encode_world_info({"node-a": [0, 1], "node-b": [1, 3]})


def specs(*argv, base_env=None, device_envs=("CUDA_VISIBLE_DEVICES",)):
    args = launch.parse_args([f"--world_info={WORLD}", *argv, "train.py", "--lr", "1"])
    return launch.build_worker_specs(args, base_env or {}, list(device_envs), log_prefix="T")


def test_second_node_gets_global_ranks_after_the_first():
    workers = specs("--node_rank=1", "--master_addr=10.0.0.1", "--master_port=4321")
    assert [(w.global_rank, w.local_rank) for w in workers] == [(2, 0), (3, 1)]
    env = workers[1].env
    assert env["RANK"] == "3" and env["LOCAL_RANK"] == "1" and env["WORLD_SIZE"] == "4"
    assert env["LOCAL_SIZE"] == "2" and env["CROSS_RANK"] == "1" and env["CROSS_SIZE"] == "2"
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "4321"
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert workers[1].cmd[-4:] == ["train.py", "--local_rank=1", "--lr", "1"]
    assert workers[1].cmd[1] == "-u"


def test_every_accelerator_visible_devices_var_is_set():
    env = specs(device_envs=("A_VISIBLE", "B_VISIBLE"))[0].env
    assert env["A_VISIBLE"] == env["B_VISIBLE"] == "0,1"


def test_program_forms():
    assert specs("--no_local_rank")[0].cmd[-3:] == ["train.py", "--lr", "1"]
    module = specs("--module")[0].cmd
    assert module[1:4] == ["-u", "-m", "train.py"]
    assert specs("--no_python")[0].cmd == ["train.py", "--local_rank=0", "--lr", "1"]


def test_module_and_no_python_conflict(capsys):
    with pytest.raises(SystemExit):
        launch.parse_args([f"--world_info={WORLD}", "--module", "--no_python", "x"])
    assert "mutually exclusive" in capsys.readouterr().err


def test_omp_threads_default_and_user_override(monkeypatch):
    monkeypatch.setattr(launch, "_available_core_count", lambda: 16)
    assert [w.env["OMP_NUM_THREADS"] for w in specs()] == ["8", "8"]
    monkeypatch.setattr(launch, "_available_core_count", lambda: 1)
    assert specs()[0].env["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in specs(base_env={"OMP_NUM_THREADS": "5"})[0].env


def test_bind_cores_without_numactl_sets_affinity(monkeypatch):
    monkeypatch.setattr(launch.core_binding, "available_cores", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(launch.core_binding, "physical_cores", lambda cores: cores)
    monkeypatch.setattr(launch.core_binding.shutil, "which", lambda name: None)
    workers = specs("--bind_cores_to_rank", base_env={"OMP_NUM_THREADS": "9"})
    assert [w.affinity for w in workers] == [[0, 1], [2, 3]]
    assert [w.env["OMP_NUM_THREADS"] for w in workers] == ["2", "2"]
    assert workers[0].cmd[0] != "numactl"


def test_bind_cores_with_numactl_prefixes_the_command(monkeypatch):
    monkeypatch.setattr(launch.core_binding, "available_cores", lambda: list(range(8)))
    monkeypatch.setattr(launch.core_binding.shutil, "which", lambda name: "/bin/numactl")
    monkeypatch.setattr(launch.core_binding, "numa_nodes", lambda: {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]})
    workers = specs("--bind_cores_to_rank", "--bind_core_list=0-1,4-5")
    assert workers[0].cmd[:5] == ["/bin/numactl", "-C", "0-1", "-m", "0"]
    assert workers[1].cmd[:5] == ["/bin/numactl", "-C", "4-5", "-m", "1"]
    assert workers[1].affinity is None and workers[1].env["OMP_NUM_THREADS"] == "2"


def test_each_rank_log_paths():
    workers = specs("--node_rank=1", "--enable_each_rank_log=/logs")
    assert [w.log_path for w in workers] == ["/logs/T_rank2.log", "/logs/T_rank3.log"]


def test_node_rank_out_of_range():
    with pytest.raises(ValueError, match="--node_rank 2 is outside \\[0, 2\\)"):
        specs("--node_rank=2")


def test_exit_wording():
    assert launch.describe_exit(3) == "exited with code 3"
    assert launch.describe_exit(-signal.SIGKILL) == "was killed by signal 9 (SIGKILL)"
    assert launch.shell_exit_code(-9) == 137 and launch.shell_exit_code(3) == 3


def test_named_device_variables_spare_the_per_node_launcher_a_torch_import():
    """With --visible_devices_envs (what the runner passes on a local launch) the per-node
    launcher sets those variables and never imports torch: it lives as long as the job."""
    code = ("import sys\n"
            "from deepspeed.launcher import launch\n"
            f"assert launch.main(['--world_info={WORLD}', '--visible_devices_envs=A_VISIBLE,B_VISIBLE', "
            "'--dry_run', 'train.py']) == 0\n"
            "print('torch imported:', 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "A_VISIBLE=0,1 B_VISIBLE=0,1" in out.stdout and "torch imported: False" in out.stdout
