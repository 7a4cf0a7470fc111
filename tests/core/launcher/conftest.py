"""Fixtures for launcher tests: a free port, the probe worker in a temp dir, and a runner call."""
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from deepspeed.testing.distributed import find_free_port

HERE = Path(__file__).parent
# variables that would change what the launcher does if inherited from the developer's shell
SCRUBBED_ENV = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "DS_ENV_FILE", "MASTER_ADDR",
                "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


@pytest.fixture
def free_port():
    return find_free_port()


@pytest.fixture
def workdir(tmp_path):
    """A cwd holding probe.py and an empty out/ directory for the per-rank JSON files."""
    shutil.copy(HERE / "probe_script.py", tmp_path / "probe.py")
    (tmp_path / "out").mkdir()
    return tmp_path


def _deepspeed_cmd():
    script = shutil.which("deepspeed") or os.path.join(os.path.dirname(sys.executable), "deepspeed")
    assert os.path.exists(script), "the `deepspeed` console script is not installed (pip install -e .)"
    return [script]


@pytest.fixture
def deepspeed_cmd():
    """argv prefix of the installed `deepspeed` console script."""
    return _deepspeed_cmd()


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env["DS_ACCELERATOR"] = "cpu"  # the same CPU-process semantics on a machine with GPUs
    env.update(extra)
    return env


@pytest.fixture
def clean_env():
    """Build a subprocess env without launcher-relevant variables from the developer's shell."""
    return _clean_env


@pytest.fixture
def run_deepspeed(workdir):
    """Run `deepspeed <args>` in workdir; returns the CompletedProcess with combined output."""

    def run(*args, env=None, timeout=120):
        return subprocess.run(_deepspeed_cmd() + [str(a) for a in args], cwd=workdir,
                              env=env or _clean_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)

    return run


def _read_ranks(out_dir):
    records = {}
    for path in sorted(Path(out_dir).glob("rank*.json")):
        record = json.loads(path.read_text())
        records[int(record["env"]["RANK"])] = record
    return records


@pytest.fixture
def read_ranks():
    """{rank: record} from the probe's rank<R>.json files in a directory."""
    return _read_ranks


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """Two "nodes" (network namespaces where allowed, else loopback addresses) for real launches;
    DS_TEST_FAKE_CLUSTER=loopback forces the loopback form."""
    from fake_cluster import FakeCluster

    use_netns = False if os.environ.get("DS_TEST_FAKE_CLUSTER") == "loopback" else None
    with FakeCluster(tmp_path_factory.mktemp("cluster"), use_netns=use_netns) as fake:
        yield fake


@pytest.fixture(scope="module")
def shared_job(tmp_path_factory, cluster):
    """`shared_job(key, starts)`: a multi-node launch that several tests of a module read.
    `starts` maps keys to `start(job)` functions (one launch each); the first test asking for any
    of them runs every launch of `starts` not run yet *at the same time*, each `start` on a fresh
    Job in its own thread, and later tests get their key's Job back. So one launch serves each
    test's own assertions, and the launches of a module overlap their waits (process start-up,
    rendezvous, teardown on every node) instead of queueing: they are independent jobs on their
    own ports, told apart by their DS_TEST_JOB tags. A failure, timeout or skip inside a `start`
    is raised in every test that reads that key."""
    from deepspeed.testing import find_free_port
    from multinode_job import Job

    jobs, outcomes = {}, {}

    def run(key, start):
        try:
            start(jobs[key])
        except BaseException as exc:  # a failure, timeout or skip: every reader sees it
            outcomes[key] = exc
        finally:
            jobs[key].cleanup()

    def get(key, starts):
        pending = {k: start for k, start in starts.items() if k not in jobs}
        for k in pending:
            jobs[k] = Job(tmp_path_factory.mktemp(f"shared-{k}"), cluster, find_free_port(),
                          _clean_env())
        threads = [threading.Thread(target=run, args=item, name=f"job-{item[0]}")
                   for item in pending.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if key in outcomes:
            raise outcomes[key]
        return jobs[key]

    yield get
    for job_ in jobs.values():
        job_.cleanup()
