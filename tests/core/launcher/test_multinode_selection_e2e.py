"""Which ranks a two-host hostfile starts where, for real, and hostfiles naming unreachable hosts.

Both "nodes" of the FakeCluster have 2 slots; `--include`/`--exclude`/`--num_nodes`/`--num_gpus`
choose the ranks, and the probe on each rank records the node it ran on and its visible devices.
Every launch of this module runs at the same time as the others (`shared_job`): independent jobs
on their own ports, each mostly waiting on its processes.
"""
import pytest

CASES = ("include", "exclude", "num_nodes", "num_gpus", "mpich_include")


def _cases(h0, h1):
    """(launcher form, runner flags, [(node, CUDA_VISIBLE_DEVICES) of rank 0, 1, ...])."""
    return {
        "include": ("pdsh", ["--include", f"{h0}:1@{h1}:0"], [(h0, "1"), (h1, "0")]),
        "exclude": ("pdsh", ["--exclude", f"{h0}:0"], [(h0, "1"), (h1, "0,1"), (h1, "0,1")]),
        "num_nodes": ("pdsh", ["--num_nodes", "1", "--force_multi"], [(h0, "0,1"), (h0, "0,1")]),
        "num_gpus": ("slurm", ["--num_nodes", "2", "--num_gpus", "1"], [(h0, "0"), (h1, "0")]),
        "mpich_include": ("mpich", ["--include", f"{h0}:1@{h1}:1"], [(h0, "1"), (h1, "1")]),
    }


def _filtered(case):
    def start(job):
        form, flags, job.expected = _cases(*job.cluster.hosts)[case]
        job.codes = job.run(job.command(form, ["node_probe.py", "--out", "out"],
                                        job.hostfile(slots=2), extra=flags))

    return start


def _unreachable(form):
    def start(job):
        hostfile = job.hostfile(hosts=[job.cluster.hosts[0], job.cluster.unreachable])
        job.codes = job.run(job.command(form, ["node_probe.py", "--out", "out"], hostfile),
                            timeout=90)

    return start


def _unresolvable_master(job):
    """--no_ssh on the second node of a hostfile whose first host (the default master) has no
    address."""
    hostfile = job.hostfile(hosts=["no-such-node.invalid", job.cluster.hosts[1]])
    cmd = [job.deepspeed, "-H", hostfile, "--no_ssh", "--node_rank", "1", "--master_port",
           str(job.port), "node_probe.py", "--out", "out"]
    job.codes = job.run([["ssh", job.cluster.hosts[1], f"cd {job.workdir} && exec " + " ".join(cmd)]],
                        timeout=90)


def launched(shared_job, key):
    """The module's launches, all started together by the first test that asks for one."""
    starts = {case: _filtered(case) for case in CASES}
    starts.update({f"unreachable-{form}": _unreachable(form) for form in ("pdsh", "mpich")})
    starts["unresolvable-master"] = _unresolvable_master
    return shared_job(key, starts)


@pytest.mark.parametrize("case", CASES)
def test_filters_choose_the_ranks_and_their_nodes(shared_job, case):
    job = launched(shared_job, case)
    expected = job.expected
    assert job.codes == [0], job.text[-6000:]
    ranks = job.ranks()
    assert sorted(ranks) == list(range(len(expected))), job.text[-6000:]
    world = len(expected)
    for rank, (node, devices) in enumerate(expected):
        record = ranks[rank]
        assert (record["node"], record["visible_devices"]) == (node, devices), record
        assert record["world_size"] == world and record["allreduce"] == world * (world - 1) // 2
    local_ranks = [ranks[r]["local_rank"] for r in range(world)]
    nodes = [node for node, _ in expected]
    assert local_ranks == [nodes[:r].count(nodes[r]) for r in range(world)]


@pytest.mark.parametrize("form", ["pdsh", "mpich"])
def test_unreachable_host_is_named_before_anything_starts(shared_job, form):
    job = launched(shared_job, f"unreachable-{form}")
    assert job.codes == [1], job.text
    assert (f"host '{job.cluster.unreachable}' is not reachable over passwordless ssh" in job.text
            and "No route to host" in job.text), job.text
    assert "started rank" not in job.text and not job.ranks()


def test_master_addr_that_does_not_resolve_is_a_clear_error(shared_job):
    """--no_ssh on the second node of a hostfile whose first host (the default master) has no
    address: the per-node launcher says so instead of waiting for the rendezvous timeout."""
    job = launched(shared_job, "unresolvable-master")
    assert job.codes == [1], job.text
    assert "--master_addr 'no-such-node.invalid' does not resolve on this node" in job.text
    assert "started rank" not in job.text and not job.ranks()
