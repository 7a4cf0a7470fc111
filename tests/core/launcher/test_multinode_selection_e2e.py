"""Which ranks a two-host hostfile starts where, for real, and hostfiles naming unreachable hosts.

Both "nodes" of the FakeCluster have 2 slots; `--include`/`--exclude`/`--num_nodes`/`--num_gpus`
choose the ranks, and the probe on each rank records the node it ran on and its visible devices.
"""
import pytest


def _cases(h0, h1):
    """(launcher form, runner flags, [(node, CUDA_VISIBLE_DEVICES) of rank 0, 1, ...])."""
    return {
        "include": ("pdsh", ["--include", f"{h0}:1@{h1}:0"], [(h0, "1"), (h1, "0")]),
        "exclude": ("pdsh", ["--exclude", f"{h0}:0"], [(h0, "1"), (h1, "0,1"), (h1, "0,1")]),
        "num_nodes": ("pdsh", ["--num_nodes", "1", "--force_multi"], [(h0, "0,1"), (h0, "0,1")]),
        "num_gpus": ("slurm", ["--num_nodes", "2", "--num_gpus", "1"], [(h0, "0"), (h1, "0")]),
        "mpich_include": ("mpich", ["--include", f"{h0}:1@{h1}:1"], [(h0, "1"), (h1, "1")]),
    }


@pytest.mark.parametrize("case", ["include", "exclude", "num_nodes", "num_gpus", "mpich_include"])
def test_filters_choose_the_ranks_and_their_nodes(job, case):
    form, flags, expected = _cases(*job.cluster.hosts)[case]
    codes = job.run(job.command(form, ["node_probe.py", "--out", "out"], job.hostfile(slots=2),
                                extra=flags))
    assert codes == [0], job.text[-6000:]
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
def test_unreachable_host_is_named_before_anything_starts(job, form):
    hostfile = job.hostfile(hosts=[job.cluster.hosts[0], job.cluster.unreachable])
    codes = job.run(job.command(form, ["node_probe.py", "--out", "out"], hostfile), timeout=90)
    assert codes == [1], job.text
    assert (f"host '{job.cluster.unreachable}' is not reachable over passwordless ssh" in job.text
            and "No route to host" in job.text), job.text
    assert "started rank" not in job.text and not job.ranks()


def test_master_addr_that_does_not_resolve_is_a_clear_error(job):
    """--no_ssh on the second node of a hostfile whose first host (the default master) has no
    address: the per-node launcher says so instead of waiting for the rendezvous timeout."""
    hostfile = job.hostfile(hosts=["no-such-node.invalid", job.cluster.hosts[1]])
    cmd = [job.deepspeed, "-H", hostfile, "--no_ssh", "--node_rank", "1", "--master_port",
           str(job.port), "node_probe.py", "--out", "out"]
    codes = job.run([["ssh", job.cluster.hosts[1], f"cd {job.workdir} && exec " + " ".join(cmd)]],
                    timeout=90)
    assert codes == [1], job.text
    assert "--master_addr 'no-such-node.invalid' does not resolve on this node" in job.text
    assert "started rank" not in job.text and not job.ranks()
