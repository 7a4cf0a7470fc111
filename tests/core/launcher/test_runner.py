"""The `deepspeed` runner in-process: flag checks, resource selection and --dry_run commands."""
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from deepspeed.launcher import launch, runner
from deepspeed.launcher.hostfile import decode_world_info
from deepspeed.utils.logging import logger


class FakeAccelerator:
    def __init__(self, name, count, device_type=None):
        self.name = name
        self._count = count
        self._device_type = device_type or name

    def device_count(self):
        return self._count

    def device_name(self, device_index=None):
        return self._device_type

    def visible_devices_envs(self):
        return ["CUDA_VISIBLE_DEVICES"]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No inherited device/env-file settings, a private cwd and HOME, logger level restored."""
    for name in ("CUDA_VISIBLE_DEVICES", "DS_ENV_FILE", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    level = logger.level
    yield
    logger.setLevel(level)


@pytest.fixture
def log_messages():
    """Messages the launcher logger emits (its handler writes to the original stdout)."""
    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Collect()
    logger.addHandler(handler)
    yield messages
    logger.removeHandler(handler)


def use_accelerator(monkeypatch, name, count, device_type=None):
    fake = FakeAccelerator(name, count, device_type)
    monkeypatch.setattr(runner, "_accelerator", lambda: fake)
    # the runner hands a local launch the names it got from its accelerator, which is the fake
    monkeypatch.setattr(launch, "visible_devices_envs", lambda given=None: fake.visible_devices_envs())


@pytest.fixture
def hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("worker-0 slots=2\nworker-1 slots=2\n")
    return str(path)


def dry_run(capsys, *argv):
    """Run the runner with --dry_run; returns (exports, command argv, worker lines)."""
    assert runner.main(["--dry_run", *argv]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out.splitlines()
    exports = dict(line[len("export "):].split("=", 1) for line in out if line.startswith("export "))
    commands = [line for line in out if line and not line.startswith(("export ", "#", "["))]
    assert len(commands) == 1, out
    workers = [line.lstrip("# ") for line in out if line.startswith("#")]
    return exports, shlex.split(commands[0]), workers


def error_of(capsys, *argv):
    assert runner.main(list(argv)) == 1
    return capsys.readouterr().err


# ---- flag validation ------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--include", "localhost:0", "--num_gpus", "1"], "Cannot specify num_nodes/gpus with include/exclude"),
    (["--exclude", "localhost:0", "--num_nodes", "1"], "Cannot specify num_nodes/gpus with include/exclude"),
    (["--include", "a", "--exclude", "b"], "mutually exclusive"),
    (["--num_gpus", "0"], "--num_gpus must be a positive integer"),
    (["--module", "--no_python"], "--module and --no_python are mutually exclusive"),
    (["--bind_core_list", "0-1"], "--bind_core_list needs --bind_cores_to_rank"),
    (["--bind_cores_to_rank", "--bind_core_list", "1-0"], "runs backwards"),
    (["--node_rank", "1"], "--node_rank is only meaningful with --no_ssh"),
    (["--no_ssh", "--force_multi"], "mutually exclusive"),
    (["--no_ssh", "--launcher", "openmpi"], "--launcher openmpi cannot be combined"),
    (["--master_port", "70000"], "--master_port must be in 1..65535"),
    (["--hostfile", "/nonexistent/hostfile"], "hostfile '/nonexistent/hostfile' does not exist"),
    (["--num_nodes", "2"], "Num nodes is >1 but no extra nodes available via hostfile"),
    (["--include", "otherhost"], "Hostname 'otherhost' not found in hostfile"),
    (["--include", "localhost:7"], "No slot '7' specified on host 'localhost'"),
])
def test_invalid_combinations(capsys, monkeypatch, argv, message):
    use_accelerator(monkeypatch, "cpu", 1)
    err = error_of(capsys, *argv, "probe.py")
    assert message in err and err.startswith("deepspeed: error: ValueError")


def test_unknown_flag_and_unknown_launcher_are_usage_errors(capsys):
    with pytest.raises(SystemExit):
        runner.parse_args(["--no_such_flag", "probe.py"])
    with pytest.raises(SystemExit):
        runner.parse_args(["--launcher", "mpiexec", "probe.py"])
    assert "invalid choice: 'mpiexec'" in capsys.readouterr().err


def test_a_flag_prefix_is_the_flag_as_argparse_allows():
    """``--num_gpu`` is an unambiguous prefix of ``--num_gpus``: accepted, as upstream's parser
    accepts it (issue 36), rather than answered with a suggestion."""
    assert runner.parse_args(["--num_gpu", "2", "train.py"]).num_gpus == 2


@pytest.mark.parametrize("typo,meant", [("--num_gpsu", "--num_gpus"),
                                         ("--master_prot=29600", "--master_port"),
                                         ("--hostfiel", "--hostfile")])
def test_a_misspelled_flag_gets_the_close_name(capsys, typo, meant):
    with pytest.raises(SystemExit):
        runner.parse_args([typo, "2", "train.py"] if "=" not in typo else [typo, "train.py"])
    assert f"unrecognized arguments: {typo} (did you mean {meant}?)" in capsys.readouterr().err


def test_an_unknown_flag_with_nothing_close_is_only_unrecognized(capsys):
    with pytest.raises(SystemExit):
        runner.parse_args(["--frobnicate", "train.py"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --frobnicate" in err and "did you mean" not in err


def test_user_args_are_not_parsed_as_launcher_flags():
    args = runner.parse_args(["--num_gpus", "2", "train.py", "--num_gpus", "7", "--deepspeed"])
    assert args.num_gpus == 2 and args.user_script == "train.py"
    assert args.user_args == ["--num_gpus", "7", "--deepspeed"]
    assert runner.parse_args(["--num_accelerators", "3", "x.py"]).num_gpus == 3


# ---- local resources ------------------------------------------------------------------------
def test_cpu_defaults_to_one_worker_per_numa_node(capsys, monkeypatch):
    use_accelerator(monkeypatch, "cpu", 1)
    _, cmd, workers = dry_run(capsys, "probe.py")
    assert decode_world_info(cmd[cmd.index("-m") + 2].split("=", 1)[1]) == {"localhost": [0]}
    assert len(workers) == 1 and "--master_addr=127.0.0.1" in cmd


def test_local_launch_hands_its_device_variables_to_the_per_node_launcher(capsys, monkeypatch):
    """The runner already asked the accelerator; the per-node launcher on the same node takes the
    names from its command line instead of importing torch to ask again."""
    use_accelerator(monkeypatch, "cpu", 1)
    _, cmd, _ = dry_run(capsys, "probe.py")
    assert "--visible_devices_envs=CUDA_VISIBLE_DEVICES" in cmd
    assert cmd[-1] == "probe.py"


def test_cpu_derived_third_party_accelerator_gets_the_cpu_pool(capsys, monkeypatch):
    use_accelerator(monkeypatch, "example", 1, device_type="cpu")
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 2)
    _, _, workers = dry_run(capsys, "--num_gpus", "2", "probe.py")
    assert len(workers) == 2


def test_cpu_num_gpus_starts_that_many_processes_even_beyond_cores(capsys, monkeypatch):
    use_accelerator(monkeypatch, "cpu", 1)
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 2)
    _, _, workers = dry_run(capsys, "--num_gpus", "3", "probe.py")
    assert [w.split("RANK=")[1].split()[0] for w in workers] == ["0", "1", "2"]


def test_cpu_ranks_beyond_cores_warn_and_say_what_will_happen(capsys, monkeypatch, log_messages):
    use_accelerator(monkeypatch, "cpu", 1)
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 2)
    _, _, workers = dry_run(capsys, "--num_gpus", "64", "probe.py")
    assert len(workers) == 64
    warning = [m for m in log_messages if "asks for 64 CPU ranks" in m]
    assert warning == ["--num_gpus 64 asks for 64 CPU ranks but host 'localhost' has 2 core(s): "
                       "starting 64 ranks anyway, 1 thread(s) each (OMP_NUM_THREADS), about 32 "
                       "ranks per core, so each step will be slower than with --num_gpus 2 or "
                       "fewer"]
    log_messages.clear()
    dry_run(capsys, "--num_gpus", "2", "probe.py")
    assert not any("CPU ranks" in m for m in log_messages)


def test_gpu_uses_every_device_and_rejects_too_many(capsys, monkeypatch):
    use_accelerator(monkeypatch, "cuda", 4)
    _, _, workers = dry_run(capsys, "probe.py")
    assert len(workers) == 4 and "CUDA_VISIBLE_DEVICES=0,1,2,3" in workers[0]
    assert "host 'localhost' has only 4 slot(s)" in error_of(capsys, "--num_gpus", "5", "probe.py")


def test_no_devices_is_a_clear_error(capsys, monkeypatch):
    use_accelerator(monkeypatch, "cuda", 0)
    assert "Unable to proceed, no GPU resources available" in error_of(capsys, "probe.py")


def test_cuda_visible_devices_becomes_include(capsys, monkeypatch, log_messages):
    use_accelerator(monkeypatch, "cuda", 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    _, _, workers = dry_run(capsys, "probe.py")
    assert len(workers) == 2 and "CUDA_VISIBLE_DEVICES=1,3" in workers[0]
    assert any("setting --include=localhost:1,3" in m for m in log_messages)


def test_cuda_visible_devices_notice(monkeypatch, log_messages):
    use_accelerator(monkeypatch, "cuda", 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    args = runner.parse_args(["probe.py"])
    env = {"CUDA_VISIBLE_DEVICES": "1,3"}
    runner.honour_visible_devices(args, env)
    assert args.include == "localhost:1,3" and "CUDA_VISIBLE_DEVICES" not in env
    args = runner.parse_args(["--num_gpus", "1", "probe.py"])
    env = {"CUDA_VISIBLE_DEVICES": "1,3"}
    runner.honour_visible_devices(args, env)
    assert args.include == "" and "CUDA_VISIBLE_DEVICES" not in env
    assert any("Detected CUDA_VISIBLE_DEVICES=1,3 but ignoring it" in m for m in log_messages)


def test_bind_cores_dry_run_shows_distinct_cores(capsys, monkeypatch):
    use_accelerator(monkeypatch, "cpu", 1)
    monkeypatch.setattr(launch.core_binding, "available_cores", lambda: [0, 1])
    monkeypatch.setattr(launch.core_binding, "physical_cores", lambda cores: cores)
    monkeypatch.setattr(launch.core_binding.shutil, "which", lambda name: None)
    _, cmd, workers = dry_run(capsys, "--num_gpus", "2", "--bind_cores_to_rank",
                              "--bind_core_list", "0-1", "probe.py")
    assert "--bind_cores_to_rank" in cmd and "--bind_core_list=0-1" in cmd
    assert workers[0].endswith("# affinity 0") and workers[1].endswith("# affinity 1")
    assert all("OMP_NUM_THREADS=1" in w for w in workers)


# ---- multi-node commands --------------------------------------------------------------------
def test_pdsh_command(capsys, monkeypatch, hostfile, tmp_path):
    use_accelerator(monkeypatch, "cuda", 2)
    (tmp_path / ".deepspeed_env").write_text("NCCL_SOCKET_IFNAME=eth1\nMY_FLAG=on\n")
    exports, cmd, _ = dry_run(capsys, "-H", hostfile, "--master_port", "9901", "--ssh_port", "2222",
                              "--launcher_args", "-u 30", "probe.py", "--deepspeed")
    assert cmd[:7] == ["pdsh", "-S", "-f", "1024", "-w", "worker-0,worker-1", "-u"]
    assert exports["PDSH_RCMD_TYPE"] == "ssh" and "-p 2222" in exports["PDSH_SSH_ARGS_APPEND"]
    remote = cmd[-1]
    assert f"export PYTHONPATH={tmp_path}" in remote and "export MY_FLAG=on" in remote
    assert "export NCCL_SOCKET_IFNAME=eth1" in remote and f"cd {tmp_path};" in remote
    launch_cmd = shlex.split(remote.split("; ")[-1])
    assert launch_cmd[1:4] == ["-u", "-m", "deepspeed.launcher.launch"]
    assert "--node_rank=%n" in launch_cmd and "--master_addr=worker-0" in launch_cmd
    assert "--master_port=9901" in launch_cmd and launch_cmd[-2:] == ["probe.py", "--deepspeed"]
    world = decode_world_info(launch_cmd[4].split("=", 1)[1])
    assert world == {"worker-0": [0, 1], "worker-1": [0, 1]}


def test_openmpi_command(capsys, monkeypatch, hostfile):
    use_accelerator(monkeypatch, "cuda", 2)
    _, cmd, _ = dry_run(capsys, "-H", hostfile, "--launcher", "openmpi", "--master_addr", "10.1.1.1",
                        "probe.py")
    assert cmd[:5] == ["mpirun", "-n", "4", "-hostfile", hostfile] and "--mca" in cmd
    assert "MASTER_ADDR=10.1.1.1" in cmd and "WORLD_SIZE=4" in cmd
    assert cmd[cmd.index("MASTER_ADDR=10.1.1.1") - 1] == "-x" and cmd[-2:][-1] == "probe.py"
    err = error_of(capsys, "-H", hostfile, "--launcher", "openmpi", "--include", "worker-0:0@worker-1",
                   "--dry_run", "probe.py")
    assert "does not support --include" in err


def test_mpich_command(capsys, monkeypatch, hostfile):
    use_accelerator(monkeypatch, "cuda", 2)
    _, cmd, _ = dry_run(capsys, "-H", hostfile, "--launcher", "mpich", "probe.py")
    assert cmd[:8] == ["mpirun", "-n", "4", "-ppn", "2", "-hosts", "worker-0,worker-1", "-genv"]
    assert "MASTER_ADDR" in cmd and cmd[cmd.index("MASTER_ADDR") + 1] == "worker-0"


def test_impi_command_spells_out_every_rank(capsys, monkeypatch, hostfile):
    use_accelerator(monkeypatch, "cuda", 2)
    _, cmd, _ = dry_run(capsys, "-H", hostfile, "--launcher", "impi", "--exclude", "worker-1:0",
                        "probe.py")
    blocks = " ".join(cmd).split(" : ")
    assert len(blocks) == 3
    assert "-host worker-1 -env RANK 2 -env LOCAL_RANK 0" in blocks[2]
    assert "-env CUDA_VISIBLE_DEVICES 1" in blocks[2] and blocks[2].endswith("--local_rank=0")
    assert "-genv WORLD_SIZE 3" in blocks[0]


def test_slurm_command(capsys, monkeypatch, hostfile):
    use_accelerator(monkeypatch, "cuda", 2)
    exports, cmd, _ = dry_run(capsys, "-H", hostfile, "--launcher", "slurm", "probe.py")
    assert cmd[:10] == ["srun", "-n", "4", "--nodes", "2", "--ntasks-per-node", "2", "--nodelist",
                        "worker-0,worker-1", "--export=ALL"]
    assert exports["MASTER_ADDR"] == "worker-0" and exports["CUDA_VISIBLE_DEVICES"] == "0,1"
    err = error_of(capsys, "-H", hostfile, "--launcher", "slurm", "--include",
                   "worker-0:0@worker-1:1", "--dry_run", "probe.py")
    assert "needs the same slots on every host" in err


def test_mvapich_command(capsys, monkeypatch, hostfile):
    use_accelerator(monkeypatch, "cuda", 2)
    _, cmd, _ = dry_run(capsys, "-H", hostfile, "--launcher", "mvapich", "--num_nodes", "1",
                        "--force_multi", "probe.py")
    assert cmd[:5] == ["mpirun_rsh", "-np", "2", "-hostfile", "/tmp/deepspeed_mvapich_hostfile"]
    assert "MV2_SUPPORT_DL=1" in cmd and "WORLD_SIZE=2" in cmd


def test_unsupported_flag_for_mpi_launcher(capsys, monkeypatch, hostfile):
    use_accelerator(monkeypatch, "cuda", 2)
    err = error_of(capsys, "-H", hostfile, "--launcher", "mpich", "--enable_each_rank_log", "logs",
                   "--dry_run", "probe.py")
    assert "--enable_each_rank_log is not supported with --launcher mpich" in err


def test_missing_launcher_binary(capsys, monkeypatch, hostfile, tmp_path):
    use_accelerator(monkeypatch, "cuda", 2)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "launcher 'pdsh' not installed" in error_of(capsys, "-H", hostfile, "probe.py")


def test_no_ssh_runs_only_this_nodes_share(capsys, monkeypatch, hostfile):
    use_accelerator(monkeypatch, "cuda", 2)
    _, cmd, workers = dry_run(capsys, "-H", hostfile, "--no_ssh", "--node_rank", "1", "probe.py")
    assert cmd[1:4] == ["-u", "-m", "deepspeed.launcher.launch"] and "--node_rank=1" in cmd
    assert "--master_addr=worker-0" in cmd
    assert ["RANK=2" in workers[0], "RANK=3" in workers[1]] == [True, True]
    err = error_of(capsys, "-H", hostfile, "--no_ssh", "probe.py")
    assert "--no_ssh needs --node_rank in [0, 2)" in err


def test_single_host_hostfile_runs_locally(capsys, monkeypatch, tmp_path):
    use_accelerator(monkeypatch, "cuda", 8)
    path = tmp_path / "one"
    path.write_text("localhost slots=2\n")
    _, cmd, workers = dry_run(capsys, "-H", str(path), "--include", "localhost:1", "probe.py")
    assert "deepspeed.launcher.launch" in cmd and len(workers) == 1
    assert "CUDA_VISIBLE_DEVICES=1" in workers[0] and "LOCAL_RANK=0" in workers[0]


def test_quiet_hides_info(capsys, monkeypatch):
    use_accelerator(monkeypatch, "cpu", 1)
    dry_run(capsys, "-q", "probe.py")
    assert logger.level == logging.WARNING


# ---- the user script, checked before any rank starts -----------------------------------------
def _no_launch(*args, **kwargs):
    raise AssertionError("a rank was started")


def test_a_missing_script_stops_the_launch_and_names_the_close_file(capsys, monkeypatch,
                                                                    tmp_path):
    use_accelerator(monkeypatch, "cpu", 1)
    monkeypatch.setattr(runner, "run_command", _no_launch)
    (tmp_path / "train_demo.py").write_text("")
    err = error_of(capsys, "--num_gpus", "2", "train_dmeo.py", "--steps", "3")
    assert err.startswith("deepspeed: error: LauncherError: the user script 'train_dmeo.py' "
                          "does not exist")
    assert "did you mean 'train_demo.py'?" in err and "(no rank was started)" in err
    assert "no rank was started" in error_of(capsys, "--module", "no_such_module_here", "-x")
    (tmp_path / "sub").mkdir()
    assert "is a directory" in error_of(capsys, "sub")


def test_scripts_that_exist_elsewhere_are_found(capsys, monkeypatch, tmp_path):
    """``--no_python`` programs on PATH and ``--module`` modules importable from the cwd."""
    use_accelerator(monkeypatch, "cpu", 1)
    monkeypatch.setattr(runner, "run_command", lambda cmd, env: 0)
    (tmp_path / "mymod.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert runner.main(["--module", "mymod"]) == 0
    assert runner.main(["--no_python", "true"]) == 0  # /usr/bin/true, through PATH
    assert runner.main(["mymod.py"]) == 0


def test_a_dry_run_or_remote_ranks_only_warn(capsys, monkeypatch, hostfile, log_messages):
    use_accelerator(monkeypatch, "cpu", 1)
    dry_run(capsys, "missing.py")
    assert any("the user script 'missing.py' does not exist" in m and "a real run would stop"
               in m for m in log_messages)
    log_messages.clear()
    monkeypatch.setattr(runner, "run_command", lambda cmd, env, pid_file=None: 0)
    monkeypatch.setattr(runner, "check_ssh", lambda hosts, port: None)
    monkeypatch.setattr(runner.RUNNERS["pdsh"], "missing_binaries", lambda self: [])
    assert runner.main(["-H", hostfile, "missing.py"]) == 0
    assert any("ranks on the other hosts will need it" in m for m in log_messages)


def test_a_launch_imports_no_torch():
    """The runner collects every installed plugin's flags, asks the accelerator for devices and
    builds the per-node launch without importing torch (seconds of CPU on every launch). Where
    a GPU might exist detection rightly asks torch, so there the CPU accelerator is named."""
    from deepspeed.accelerator import real_accelerator

    env = {k: v for k, v in os.environ.items() if k != real_accelerator.ENV_VAR}
    if real_accelerator.might_have_gpu():
        env[real_accelerator.ENV_VAR] = "cpu"
    code = ("import sys\n"
            "from deepspeed.launcher import runner\n"
            "assert runner.main(['--dry_run', '--num_gpus', '2', 'train.py']) == 0\n"
            "print('torch imported:', sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])\n")
    Path("train.py").write_text("print('never run')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "RANK=1" in out.stdout  # the dry run printed both ranks' commands
    assert "torch imported: []" in out.stdout, out.stdout
