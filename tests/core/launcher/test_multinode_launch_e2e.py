"""Real multi-node launches of the `deepspeed` command onto two "nodes" of a FakeCluster.

Each launcher form runs the command line the runner builds, for real: pdsh (the real pdsh when
installed) over ssh, MPICH's `mpirun` (hydra over ssh), srun, and the torchrun-like `--no_ssh`
form started on each node by hand. The nodes are network namespaces with their own addresses
where the test may create them, else loopback addresses (see fake_cluster.py). The workers are
the README demo (examples/train_demo.py) or a probe that records where each rank ran.

The four forms' launches of each kind run at the same time (`shared_job`): they are independent
jobs on their own ports, and most of a launch's wall time is waiting on its processes.
"""
import subprocess
import time
from pathlib import Path

import psutil
import pytest

DEMO = Path(__file__).parents[3] / "examples" / "train_demo.py"
FORMS = ("pdsh", "mpich", "slurm", "no_ssh")
# how long the job may take to end everywhere after one rank dies (the bound)
RANK_DEATH_BOUND_S = 45


def _probe_then_demo(form):
    def start(job):
        job.codes = job.run(job.command(
            form, ["node_probe.py", "--out", "out", "--then", DEMO, "--steps", 8, "--samples", 512,
                   "--print_every", 4], job.hostfile()))

    return start


def probe_then_demo(shared_job, form):
    """One launch per form, shared by the two tests below: each rank records where it ran
    (node_probe.py), then trains the README demo in the group it joined."""
    return shared_job(form, {f: _probe_then_demo(f) for f in FORMS})


@pytest.mark.parametrize("form", FORMS)
def test_two_nodes_train_the_demo(shared_job, form):
    """2 nodes x 1 rank join one gloo group and train the README demo, through each launcher."""
    job = probe_then_demo(shared_job, form)
    codes = job.codes
    assert codes == [0] * len(codes), job.text[-6000:]
    assert "world size        : 2 (backend gloo)" in job.text, job.text[-6000:]
    assert "replicas identical: True" in job.text
    assert "optimizer steps   : 8 x 32 samples" in job.text


@pytest.mark.parametrize("form", FORMS)
def test_ranks_land_on_their_nodes(shared_job, form):
    job = probe_then_demo(shared_job, form)
    codes = job.codes
    assert codes == [0] * len(codes), job.text[-6000:]
    ranks = job.ranks()
    assert sorted(ranks) == [0, 1], job.text[-6000:]
    for rank, host in enumerate(job.cluster.hosts):
        record = ranks[rank]
        assert record["node"] == host and record["world_size"] == 2 and record["allreduce"] == 1
        assert record["local_rank"] == 0
        if job.cluster.use_netns:
            assert record["address"] == host  # the rank really ran in that node's namespace


def _kill_rank_1(form):
    """Train the demo until step 2, SIGKILL rank 1's worker, and record how the job ended."""
    def start(job):
        job.start(job.command(form, [DEMO, "--epochs", 100000, "--samples", 256,
                                     "--print_every", 1], job.hostfile()))
        job.wait_for("step    2:", timeout=200)
        workers = job.workers()
        assert sorted(workers) == [0, 1], job.text[-4000:]
        job.victim = workers[1]
        job.victim.kill()
        killed_at = time.monotonic()
        try:
            job.codes = job.wait(timeout=RANK_DEATH_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{form}: the job was still running {RANK_DEATH_BOUND_S} s after rank 1 "
                        f"died:\n{job.text[-4000:]}")
        job.ended_after = time.monotonic() - killed_at
        job.outlived = psutil.wait_procs(list(workers.values()), timeout=10)[1]

    return start


@pytest.mark.parametrize("form", FORMS)
def test_killing_one_rank_ends_the_job_everywhere(shared_job, form):
    job = shared_job(f"kill-{form}", {f"kill-{f}": _kill_rank_1(f) for f in FORMS})
    print(f"{form}: job ended {job.ended_after:.1f} s after rank 1 was killed")
    assert all(code != 0 for code in job.codes), job.text[-4000:]
    assert job.outlived == [], "a worker outlived the job"
    if form in ("pdsh", "no_ssh"):  # the per-node launcher names it
        expected = f"rank 1 (local rank 0, pid {job.victim.pid}) was killed by signal 9 (SIGKILL)"
    else:  # the rank guard around each MPI/srun-started worker names it
        variable = {"mpich": "PMI_RANK", "slurm": "SLURM_PROCID"}[form]
        expected = f"rank 1 (from {variable}, pid {job.victim.pid} on "
    assert expected in job.text, job.text[-4000:]
    assert "was killed by signal 9 (SIGKILL)" in job.text
