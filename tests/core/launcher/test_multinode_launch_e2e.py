"""Real multi-node launches of the `deepspeed` command onto two "nodes" of a FakeCluster.

Each launcher form runs the command line the runner builds, for real: pdsh (the real pdsh when
installed) over ssh, MPICH's `mpirun` (hydra over ssh), srun, and the torchrun-like `--no_ssh`
form started on each node by hand. The nodes are network namespaces with their own addresses
where the test may create them, else loopback addresses (see fake_cluster.py). The workers are
the README demo (examples/train_demo.py) or a probe that records where each rank ran.
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from fake_cluster import FakeCluster

HERE = Path(__file__).parent
REPO = HERE.parents[2]
DEMO = REPO / "examples" / "train_demo.py"
RANK_VARS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
FORMS = ("pdsh", "mpich", "slurm", "no_ssh")
# how long the job may take to end everywhere after one rank dies (the bound)
RANK_DEATH_BOUND_S = 45


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with FakeCluster(tmp_path_factory.mktemp("cluster")) as fake:
        yield fake


@pytest.fixture
def job(tmp_path, cluster, free_port, clean_env):
    return Job(tmp_path, cluster, free_port, clean_env())


def _mpirun():
    local = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return local if os.path.exists(local) else shutil.which("mpirun")


class Job:
    """One launch in its own directory; `tag` marks every worker it starts (via .deepspeed_env)."""

    def __init__(self, workdir, cluster, port, env):
        self.workdir, self.cluster, self.port = workdir, cluster, port
        self.tag = uuid.uuid4().hex
        # .deepspeed_env is how variables reach remote nodes; workers are CPU processes here
        (workdir / ".deepspeed_env").write_text(f"DS_ACCELERATOR=cpu\nDS_TEST_JOB={self.tag}\n")
        (workdir / "out").mkdir()
        shutil.copy(HERE / "node_probe_script.py", workdir / "node_probe.py")
        self.env = cluster.env(env)
        self.procs = []
        self.output = []
        self._readers = []
        self.deepspeed = os.path.join(os.path.dirname(sys.executable), "deepspeed")

    def hostfile(self, slots=1, hosts=None):
        return self.cluster.hostfile(self.workdir / "hostfile", slots, hosts)

    def command(self, form, script_args, hostfile, extra=()):
        """The `deepspeed` argv of `form` (for no_ssh: one ssh command per node)."""
        base = [self.deepspeed, "-H", hostfile, "--master_port", str(self.port), *extra]
        if form == "no_ssh":
            master = self.cluster.hosts[0]
            return [["ssh", host, f"cd {self.workdir} && exec " + " ".join(
                base + ["--no_ssh", "--node_rank", str(i), "--master_addr", master]
                + [str(a) for a in script_args])]
                for i, host in enumerate(self.cluster.hosts)]
        if form == "mpich":
            if _mpirun() is None:
                pytest.skip("no mpirun (pip install mpich, in the dev extra)")
            # hydra's proxies call back to the launching machine at this address
            base += ["--launcher", "mpich", "--launcher_args", f"-localhost {self.cluster.controller}"]
        elif form != "pdsh":
            base += ["--launcher", form]
        return [base + [str(a) for a in script_args]]

    def start(self, commands):
        for cmd in commands:
            proc = subprocess.Popen(cmd, cwd=self.workdir, env=self.env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            reader = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
            reader.start()
            self.procs.append(proc)
            self._readers.append(reader)

    def _read(self, stream):
        for line in stream:
            self.output.append(line)

    @property
    def text(self):
        return "".join(self.output)

    def wait(self, timeout):
        """Exit codes of every started command; raises TimeoutExpired if one outlives timeout."""
        deadline = time.monotonic() + timeout
        codes = [proc.wait(timeout=max(0.1, deadline - time.monotonic())) for proc in self.procs]
        for reader in self._readers:
            reader.join(timeout=5)
        return codes

    def run(self, commands, timeout=120):
        self.start(commands)
        return self.wait(timeout)

    def wait_for(self, needle, timeout):
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            if time.monotonic() > deadline or all(p.poll() is not None for p in self.procs):
                raise AssertionError(f"never saw {needle!r}:\n{self.text[-4000:]}")
            time.sleep(0.2)

    def workers(self):
        """{rank: psutil.Process} of the worker processes this job started, on any node."""
        found = {}
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if {"deepspeed.launcher.launch", "deepspeed.launcher.rank_guard"} & set(cmdline) or not any(
                    a.endswith((".py",)) for a in cmdline):
                continue
            try:
                env = proc.environ()
            except psutil.Error:
                continue
            if env.get("DS_TEST_JOB") != self.tag:
                continue
            rank = next((env[k] for k in RANK_VARS if env.get(k)), None)
            if rank is not None and os.path.basename(cmdline[0]).startswith("python"):
                found[int(rank)] = proc
        return found

    def ranks(self):
        return {int(p.stem[4:]): json.loads(p.read_text())
                for p in (self.workdir / "out").glob("rank*.json")}

    def cleanup(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
        for worker in self.workers().values():
            worker.kill()


@pytest.fixture(autouse=True)
def _stop_leftovers(request):
    yield
    job_ = request.node.funcargs.get("job")
    if job_ is not None:
        job_.cleanup()


@pytest.mark.parametrize("form", FORMS)
def test_two_nodes_train_the_demo(job, form):
    """2 nodes x 1 rank join one gloo group and train the README demo, through each launcher."""
    codes = job.run(job.command(form, [DEMO, "--steps", 8, "--samples", 512, "--print_every", 4],
                                job.hostfile()))
    assert codes == [0] * len(codes), job.text[-6000:]
    assert "world size        : 2 (backend gloo)" in job.text, job.text[-6000:]
    assert "replicas identical: True" in job.text
    assert "optimizer steps   : 8 x 32 samples" in job.text


@pytest.mark.parametrize("form", FORMS)
def test_ranks_land_on_their_nodes(job, form):
    codes = job.run(job.command(form, ["node_probe.py", "--out", "out"], job.hostfile()))
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
    job.wait_for("step    2:", timeout=150)
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
