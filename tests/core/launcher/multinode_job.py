"""A launch of the `deepspeed` command onto a FakeCluster, watched from the test.

`Job` owns one working directory: the hostfile, a `.deepspeed_env` that carries DS_ACCELERATOR=cpu,
a unique DS_TEST_JOB tag and OMP_NUM_THREADS=1 to every worker (the documented way variables reach
remote nodes; every fake node sees all of this machine's cores, so the launchers' per-node share,
cores / ranks on the node, would still give each node's rank every core, and two ranks spinning
one thread per core made the srun form's demo steps ~10x slower), the probe, and the output of
every command it starts. The tag finds the job's worker processes
on any node, so a test can kill one rank and check that none outlives the job.
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid

import psutil
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

RANK_VARS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
def _mpirun():
    local = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return local if os.path.exists(local) else shutil.which("mpirun")


class Job:
    """One launch in its own directory; `tag` marks every worker it starts (via .deepspeed_env)."""

    def __init__(self, workdir, cluster, port, env):
        self.workdir, self.cluster, self.port = workdir, cluster, port
        self.tag = uuid.uuid4().hex
        # .deepspeed_env is how variables reach remote nodes; workers are CPU processes here
        (workdir / ".deepspeed_env").write_text(
            f"DS_ACCELERATOR=cpu\nDS_TEST_JOB={self.tag}\nOMP_NUM_THREADS=1\n")
        (workdir / "out").mkdir()
        shutil.copy(os.path.join(HERE, "node_probe_script.py"), workdir / "node_probe.py")
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

    def run(self, commands, timeout=240):
        """Start `commands` and wait for all; a launch still running after `timeout` fails the
        test with its output (generous: the machine running the tests may be heavily shared)."""
        self.start(commands)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"launch still running after {timeout} s:\n{self.text[-6000:]}")

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
