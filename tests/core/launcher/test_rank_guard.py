"""rank_guard: the wrapper around each MPI/srun-started worker that names a rank when it dies."""
import functools
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from deepspeed.launcher.rank_guard import _die_with_parent, rank_of, thread_share

GUARD = [sys.executable, "-m", "deepspeed.launcher.rank_guard", "--"]


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK",
                        "SLURM_PROCID")}
    env.update(extra)
    return env


@pytest.mark.parametrize("env, expected", [
    ({"PMI_RANK": "3"}, ("3", "PMI_RANK")),
    ({"SLURM_PROCID": "0", "OMPI_COMM_WORLD_RANK": "5"}, ("5", "OMPI_COMM_WORLD_RANK")),
    ({"RANK": "2", "PMI_RANK": "7"}, ("2", "RANK")),
    ({"PMI_RANK": ""}, ("?", None)),
])
def test_rank_comes_from_the_launchers_variable(env, expected):
    assert rank_of(env) == expected


@pytest.mark.parametrize("env, expected", [
    ({"MPI_LOCALNRANKS": "2"}, "4"),                      # MPICH / Intel MPI
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, "2"),           # Open MPI: 8 // 3
    ({"SLURM_NTASKS_PER_NODE": "16"}, "1"),               # never below one
    ({"LOCAL_SIZE": "1", "MPI_LOCALNRANKS": "8"}, "8"),   # the deepspeed runner's own first
    ({"MPI_LOCALNRANKS": "2", "OMP_NUM_THREADS": "6"}, None),  # the user's setting wins
    ({}, None),                                            # node's rank count unknown
])
def test_each_rank_gets_its_share_of_the_cores(env, expected):
    assert thread_share(env, cores=8) == expected


def test_the_worker_runs_with_its_thread_share():
    env = _env(PMI_RANK="0", MPI_LOCALNRANKS=str(len(os.sched_getaffinity(0))))
    env.pop("OMP_NUM_THREADS", None)
    result = subprocess.run(GUARD + [sys.executable, "-c",
                                     "import os; print(os.environ['OMP_NUM_THREADS'])"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == "1\n", result.stderr


def test_success_passes_output_and_status_through():
    result = subprocess.run(GUARD + [sys.executable, "-c", "print('worker says hi')"],
                            env=_env(PMI_RANK="1"), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == "worker says hi\n"
    assert "rank 1" not in result.stderr + result.stdout


@pytest.mark.parametrize("code, status, wording", [
    ("raise SystemExit(3)", 3, "exited with code 3"),
    ("import os; os.kill(os.getpid(), 9)", 128 + 9, "was killed by signal 9 (SIGKILL)"),
])
def test_a_dying_rank_is_named_and_its_status_kept(code, status, wording):
    result = subprocess.run(GUARD + [sys.executable, "-c", code], env=_env(SLURM_PROCID="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert result.returncode == status
    assert "rank 1 (from SLURM_PROCID, pid " in result.stdout and wording in result.stdout


def test_open_descriptors_reach_the_worker(tmp_path):
    """MPICH hands each rank its PMI connection as an inherited fd (PMI_FD)."""
    read_fd, write_fd = os.pipe()
    script = f"import os; os.write({write_fd}, b'through the guard')"
    proc = subprocess.run(GUARD + [sys.executable, "-c", script], env=_env(PMI_RANK="0"),
                          pass_fds=(write_fd,), timeout=60)
    os.close(write_fd)
    assert proc.returncode == 0
    assert os.read(read_fd, 100) == b"through the guard"
    os.close(read_fd)


def _child_of(proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = psutil.Process(proc.pid).children()
        if children:
            return children[0]
        time.sleep(0.05)
    raise AssertionError("the guard never started its worker")


@pytest.mark.fresh_python  # finds the worker among the guard process's children
def test_sigterm_is_forwarded_and_reported():
    proc = subprocess.Popen(GUARD + [sys.executable, "-c", "import time; time.sleep(600)"],
                            env=_env(PMI_RANK="4"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        worker = _child_of(proc)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert "rank 4 (from PMI_RANK" in output and "signal 15 (SIGTERM)" in output
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE


@pytest.mark.fresh_python  # finds the worker among the guard process's children
def test_worker_dies_with_a_killed_guard():
    proc = subprocess.Popen(GUARD + [sys.executable, "-c", "import time; time.sleep(600)"],
                            env=_env(PMI_RANK="0"))
    worker = _child_of(proc)
    proc.kill()
    proc.wait(timeout=30)
    assert psutil.wait_procs([worker], timeout=30)[1] == []


def test_a_worker_whose_guard_died_before_it_armed_the_signal_ends_itself():
    """The guard can be killed between its fork and the worker's prctl, which then never fires:
    the worker checks that its parent is still the guard that started it."""
    gone_guard = os.getpid() + 1_000_000  # not this worker's parent: the guard is already gone
    worker = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True,
                            text=True, timeout=60,
                            preexec_fn=functools.partial(_die_with_parent, gone_guard))
    assert worker.returncode == -signal.SIGKILL and worker.stdout == ""
    alive = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True,
                           timeout=60, preexec_fn=functools.partial(_die_with_parent, os.getpid()))
    assert alive.returncode == 0 and alive.stdout == "ran\n"
