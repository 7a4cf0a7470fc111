"""Core-list parsing and splitting for --bind_cores_to_rank."""
import pytest

from deepspeed.utils import numa as cores
from deepspeed.utils.numa import format_core_list, parse_core_list, split_cores


def test_parse_ranges_and_singles():
    assert parse_core_list("0-1") == [0, 1]
    assert parse_core_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_core_list(" 5 , 2-3 ") == [2, 3, 5]


@pytest.mark.parametrize("text, problem", [
    ("", "empty"),
    ("a-b", "'a-b' is not a core id"),
    ("3-1", "runs backwards"),
    ("0,,1", "'' is not a core id"),
    ("0-2,1", "core 1 is listed twice"),
    ("1-2-3", "not a core id"),
    ("-1", "not a core id"),
])
def test_malformed_lists_are_rejected(text, problem):
    with pytest.raises(ValueError, match=problem) as err:
        parse_core_list(text)
    assert "--bind_core_list" in str(err.value)


def test_format_is_inverse_of_parse():
    assert format_core_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert parse_core_list(format_core_list([3, 4, 9])) == [3, 4, 9]


def test_split_matches_the_tutorial_example():
    listed = parse_core_list("0-27,32-59")
    shares = split_cores(listed, 4)
    assert [format_core_list(s) for s in shares] == ["0-13", "14-27", "32-45", "46-59"]


def test_split_leaves_the_remainder_idle_and_refuses_too_many_ranks():
    assert split_cores([0, 1, 2], 2) == [[0], [1]]
    with pytest.raises(ValueError, match="cannot bind 3 ranks to 2 core"):
        split_cores([0, 1], 3)


def test_core_list_must_be_available(monkeypatch):
    monkeypatch.setattr(cores, "available_cores", lambda: [0, 1])
    assert cores.rank_core_assignment(2, "0-1") == [[0], [1]]
    with pytest.raises(ValueError, match="core\\(s\\) 5-6 are not available"):
        cores.rank_core_assignment(1, "0,5-6")


def test_numactl_prefix_absent_without_numactl(monkeypatch):
    monkeypatch.setattr(cores.shutil, "which", lambda name: None)
    assert cores.numactl_prefix([0]) is None


def test_numactl_prefix_binds_cores_and_their_numa_node(monkeypatch):
    monkeypatch.setattr(cores.shutil, "which", lambda name: "/usr/bin/numactl")
    monkeypatch.setattr(cores, "numa_nodes", lambda: {0: [0, 1], 1: [2, 3]})
    assert cores.numactl_prefix([2, 3]) == ["/usr/bin/numactl", "-C", "2-3", "-m", "1"]
