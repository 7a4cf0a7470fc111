"""Multi-node launches on a two-node fake cluster: start-up time and how fast a rank death ends the job.

    python tools/bench/launcher_multinode_bench.py [--forms pdsh,mpich,slurm,no_ssh] [--repeats 1]

For each launcher form, on the FakeCluster of tests/core/launcher (two network namespaces when
the machine allows it, else loopback addresses; ssh/srun stand-ins, the real pdsh/mpirun):

* ``start``: seconds from starting `deepspeed` to rank 0's first training step of the README demo
  (2 nodes x 1 rank, gloo);
* ``end after kill``: seconds from SIGKILL of rank 1 (on the second node) to the exit of every
  launch command, i.e. until the job has stopped on both nodes (the issue's bound is 45 s).

Printed as a table with the median over --repeats. A tool, not a test: it reuses the test
harness (tests/core/launcher/multinode_job.py) and needs the `deepspeed` console script installed.
"""
import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "core" / "launcher"))

from fake_cluster import FakeCluster  # noqa: E402  (test harness, by path)
from multinode_job import Job  # noqa: E402

DEMO = REPO / "examples" / "train_demo.py"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_run(cluster, form, root):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "DS_ENV_FILE")}
    env["DS_ACCELERATOR"] = "cpu"
    job = Job(Path(tempfile.mkdtemp(dir=root)), cluster, free_port(), env)
    try:
        started = time.monotonic()
        job.start(job.command(form, [DEMO, "--epochs", 100000, "--samples", 256, "--print_every", 1],
                              job.hostfile()))
        job.wait_for("step    1:", timeout=300)
        start_s = time.monotonic() - started
        workers = job.workers()
        workers[1].kill()
        killed = time.monotonic()
        codes = job.wait(timeout=120)
        end_s = time.monotonic() - killed
        named = "rank 1 (" in job.text
        return start_s, end_s, codes, named
    finally:
        job.cleanup()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forms", default="pdsh,mpich,slurm,no_ssh")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root, FakeCluster(Path(root) / "cluster") as cluster:
        print(f"fake cluster: {cluster.mode}, nodes {', '.join(cluster.hosts)}; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"{'form':8s} {'start (s)':>10s} {'end after kill (s)':>19s}  rank named  exit codes")
        for form in args.forms.split(","):
            runs = [one_run(cluster, form, root) for _ in range(args.repeats)]
            start = statistics.median(r[0] for r in runs)
            end = statistics.median(r[1] for r in runs)
            print(f"{form:8s} {start:10.1f} {end:19.1f}  {str(all(r[3] for r in runs)):10s}  "
                  f"{runs[-1][2]}")


if __name__ == "__main__":
    main()
