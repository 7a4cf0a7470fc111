"""Real launches through the `deepspeed` console script, each worker a CPU process on gloo."""
import os
import signal
import stat
import subprocess
import sys
import time

import psutil
import pytest


def worker_gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_two_workers_join_one_gloo_world(run_deepspeed, workdir, free_port, read_ranks):
    result = run_deepspeed("--num_gpus", 2, "--master_port", free_port, "probe.py",
                           "--out", "out", "--allreduce")
    assert result.returncode == 0, result.stdout
    ranks = read_ranks(workdir / "out")
    assert sorted(ranks) == [0, 1]
    for rank, record in ranks.items():
        env = record["env"]
        assert env["WORLD_SIZE"] == "2" and env["LOCAL_SIZE"] == "2"
        assert env["LOCAL_RANK"] == str(rank) and record["local_rank_arg"] == rank
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(free_port)
        assert env["CROSS_RANK"] == "0" and env["CROSS_SIZE"] == "1"
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
        # 2 workers share this machine's cores instead of each starting one thread per core
        assert env["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))
        assert record["allreduce"] == 1


def test_include_one_slot_starts_one_worker(run_deepspeed, workdir, free_port, read_ranks):
    result = run_deepspeed("--include", "localhost:1", "--master_port", free_port, "probe.py",
                           "--out", "out")
    assert result.returncode == 0, result.stdout
    ranks = read_ranks(workdir / "out")
    assert list(ranks) == [0]
    env = ranks[0]["env"]
    assert env["LOCAL_RANK"] == "0" and env["WORLD_SIZE"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_include_with_num_gpus_is_a_value_error(run_deepspeed, workdir):
    result = run_deepspeed("--include", "localhost:0", "--num_gpus", 1, "probe.py", "--out", "out")
    assert result.returncode != 0
    assert "ValueError" in result.stdout and "Cannot specify num_nodes/gpus" in result.stdout
    assert not list((workdir / "out").iterdir())


@pytest.mark.fresh_python  # the launcher names the pid it started; a warm fork has another
@pytest.mark.parametrize("mode, expected_code, wording", [
    ("exit3", 3, "exited with code 3"),
    ("sigkill", 128 + signal.SIGKILL, "was killed by signal 9 (SIGKILL)"),
])
def test_failing_rank_stops_the_job(run_deepspeed, workdir, free_port, read_ranks, mode,
                                    expected_code, wording):
    result = run_deepspeed("--num_gpus", 2, "--master_port", free_port, "probe.py", "--out", "out",
                           "--fail_rank", 1, "--fail_mode", mode, "--sleep", 600, timeout=90)
    assert result.returncode == expected_code, result.stdout
    ranks = read_ranks(workdir / "out")
    assert f"rank 1 (local rank 1, pid {ranks[1]['pid']}) {wording}" in result.stdout
    assert "terminating the remaining worker(s): rank(s) 0" in result.stdout
    assert worker_gone(ranks[0]["pid"])


def test_sigterm_to_the_runner_reaches_the_workers(workdir, free_port, read_ranks, clean_env,
                                                  deepspeed_cmd):
    proc = subprocess.Popen(deepspeed_cmd + ["--num_gpus", "2", "--master_port", str(free_port),
                                               "probe.py", "--out", "out", "--sleep", "600"],
                            cwd=workdir, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while len(read_ranks(workdir / "out")) < 2 and proc.poll() is None:
            assert time.monotonic() < deadline, "workers never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, output
    assert "received SIGTERM" in output
    assert all(worker_gone(r["pid"]) for r in read_ranks(workdir / "out").values())


def test_two_emulated_nodes_with_no_ssh(workdir, free_port, read_ranks, clean_env, deepspeed_cmd):
    (workdir / "hostfile").write_text("node-a slots=1\nnode-b slots=1\n")
    procs = [subprocess.Popen(deepspeed_cmd + [
        "-H", "hostfile", "--no_ssh", "--node_rank", str(node), "--master_addr", "127.0.0.1",
        "--master_port", str(free_port), "probe.py", "--out", "out", "--allreduce"],
        cwd=workdir, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in (0, 1)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=120)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [p.returncode for p in procs] == [0, 0], outputs
    ranks = read_ranks(workdir / "out")
    assert sorted(ranks) == [0, 1]
    for rank, record in ranks.items():
        env = record["env"]
        assert env["WORLD_SIZE"] == "2" and env["CROSS_RANK"] == str(rank) and env["CROSS_SIZE"] == "2"
        assert env["LOCAL_RANK"] == "0" and env["CUDA_VISIBLE_DEVICES"] == "0"
        assert record["allreduce"] == 1


def test_user_omp_threads_and_no_local_rank(run_deepspeed, workdir, free_port, read_ranks,
                                            clean_env):
    (workdir / ".deepspeed_env").write_text("FROM_DS_ENV_FILE=yes\n")
    result = run_deepspeed("--num_gpus", 1, "--no_local_rank", "--master_port", free_port,
                           "probe.py", "--out", "out", env=clean_env(OMP_NUM_THREADS="3"))
    assert result.returncode == 0, result.stdout
    record = read_ranks(workdir / "out")[0]
    assert record["env"]["OMP_NUM_THREADS"] == "3"
    assert record["env"]["FROM_DS_ENV_FILE"] == "yes"
    assert record["local_rank_arg"] is None
    assert not any(a.startswith("--local_rank") for a in record["argv"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to bind 2 ranks")
def test_bind_cores_to_rank_gives_each_rank_its_own_core(run_deepspeed, workdir, free_port,
                                                         read_ranks):
    result = run_deepspeed("--num_accelerators", 2, "--bind_cores_to_rank", "--master_port",
                           free_port, "probe.py", "--out", "out")
    assert result.returncode == 0, result.stdout
    ranks = read_ranks(workdir / "out")
    affinities = [ranks[r]["affinity"] for r in (0, 1)]
    assert all(len(a) == 1 for a in affinities) and affinities[0] != affinities[1]
    assert all(ranks[r]["env"]["OMP_NUM_THREADS"] == "1" for r in (0, 1))


@pytest.mark.fresh_python  # the rank reads the runner's pid file through its parent process
def test_module_and_save_pid(run_deepspeed, workdir, free_port, read_ranks):
    result = run_deepspeed("--num_gpus", 1, "--module", "--save_pid", "--master_port", free_port,
                           "probe", "--out", "out", "--read_pid_file")
    assert result.returncode == 0, result.stdout
    record = read_ranks(workdir / "out")[0]
    assert record["local_rank_arg"] == 0
    # the pid file names the per-node launcher, i.e. the worker's parent
    assert record["pid_file"] == str(record["ppid"])


def test_no_python_runs_the_program_directly(run_deepspeed, workdir, free_port, read_ranks):
    script = workdir / "probe.sh"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} probe.py \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    result = run_deepspeed("--num_gpus", 1, "--no_python", "--master_port", free_port,
                           "./probe.sh", "--out", "out")
    assert result.returncode == 0, result.stdout
    record = read_ranks(workdir / "out")[0]
    assert record["argv"][0] == "--local_rank=0"


def test_each_rank_log(run_deepspeed, workdir, free_port):
    result = run_deepspeed("--num_gpus", 2, "--enable_each_rank_log", "logs", "--master_port",
                           free_port, "probe.py", "--out", "out")
    assert result.returncode == 0, result.stdout
    assert "hello from rank" not in result.stdout
    logs = sorted((workdir / "logs").glob("*_rank*.log"))
    assert [p.name.rsplit("_", 1)[1] for p in logs] == ["rank0.log", "rank1.log"]
    for rank, path in enumerate(logs):
        assert f"hello from rank {rank}" in path.read_text()
