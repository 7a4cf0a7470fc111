"""``deepspeed.utils.numa`` under upstream's names: range parsing, the NUMA nodes' cores, and the
numactl command that binds one local rank to its share of the cores."""
import pytest

from deepspeed.utils import numa


def test_range_parsing():
    assert numa.parse_range("3-5") == [3, 4, 5] and numa.parse_range("7") == [7]
    assert numa.parse_range_list("8,0-3,10-11") == [0, 1, 2, 3, 8, 10, 11]
    for bad, why in (("0-3,2", "listed twice"), ("5-2", "backwards"), ("a", "not a core id")):
        with pytest.raises(ValueError, match=why):
            numa.parse_range_list(bad)


def test_numa_cores_cover_the_nodes():
    nodes = numa.numa_nodes()
    cores = numa.get_numa_cores()
    assert cores == (list(nodes.values()) if nodes else [numa.available_cores()])
    assert all(c == sorted(c) for c in cores)


def test_numactl_command_per_local_rank(monkeypatch):
    available = numa.available_cores()
    if len(available) < 2:
        pytest.skip("needs two cores")
    monkeypatch.setattr(numa, "numa_nodes", lambda: {0: available})
    listed = numa.format_core_list(available[:2])
    for rank in range(2):
        per_rank, command = numa.get_numactl_cmd(listed, 2, rank)
        assert per_rank == 1
        assert command == ["numactl", "-C", str(available[rank]), "-m", "0"]
    with pytest.raises(ValueError, match="local_rank 2"):
        numa.get_numactl_cmd(listed, 2, 2)
    with pytest.raises(ValueError, match="cannot bind 3 ranks"):
        numa.get_numactl_cmd(listed, 3, 0)
    assert isinstance(numa.check_for_numactl_pkg(), bool)
