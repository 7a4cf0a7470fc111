"""Real multi-node launches of the `deepspeed` command onto two "nodes" of a FakeCluster.

Each launcher form runs the command line the runner builds, for real: pdsh (the real pdsh when
installed) over ssh, MPICH's `mpirun` (hydra over ssh), srun, and the torchrun-like `--no_ssh`
form started on each node by hand. The nodes are network namespaces with their own addresses
where the test may create them, else loopback addresses (see fake_cluster.py). The workers are
the README demo (examples/train_demo.py) or a probe that records where each rank ran.
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


def probe_then_demo(shared_job, form):
    """One launch per form, shared by the two tests below: each rank records where it ran
    (node_probe.py), then trains the README demo in the group it joined."""
    def start(job):
        job.codes = job.run(job.command(
            form, ["node_probe.py", "--out", "out", "--then", DEMO, "--steps", 8, "--samples", 512,
                   "--print_every", 4], job.hostfile()))

    return shared_job(form, start)


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


@pytest.mark.parametrize("form", FORMS)
def test_killing_one_rank_ends_the_job_everywhere(job, form):
    job.start(job.command(form, [DEMO, "--epochs", 100000, "--samples", 256, "--print_every", 1],
                          job.hostfile()))
    job.wait_for("step    2:", timeout=200)
    workers = job.workers()
    assert sorted(workers) == [0, 1], job.text[-4000:]
    victim = workers[1]
    victim.kill()
    killed_at = time.monotonic()
    try:
        codes = job.wait(timeout=RANK_DEATH_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{form}: the job was still running {RANK_DEATH_BOUND_S} s after rank 1 died:"
                    f"\n{job.text[-4000:]}")
    print(f"{form}: job ended {time.monotonic() - killed_at:.1f} s after rank 1 was killed")
    assert all(code != 0 for code in codes), job.text[-4000:]
    assert psutil.wait_procs(list(workers.values()), timeout=10)[1] == [], "a worker outlived the job"
    if form in ("pdsh", "no_ssh"):  # the per-node launcher names it
        expected = f"rank 1 (local rank 0, pid {victim.pid}) was killed by signal 9 (SIGKILL)"
    else:  # the rank guard around each MPI/srun-started worker names it
        variable = {"mpich": "PMI_RANK", "slurm": "SLURM_PROCID"}[form]
        expected = f"rank 1 (from {variable}, pid {victim.pid} on "
    assert expected in job.text, job.text[-4000:]
    assert "was killed by signal 9 (SIGKILL)" in job.text
