"""Hostfile parsing, include/exclude filtering and world-info encoding (pure functions)."""
from collections import OrderedDict

import pytest

from deepspeed.launcher.hostfile import (decode_world_info, encode_world_info, fetch_hostfile,
                                         parse_hostfile, parse_inclusion_exclusion,
                                         parse_resource_filter)


def test_two_hosts_parse_in_order(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# cluster\nhostname1 slots=8\n\n  hostname2   slots=8  # second\n")
    pool = fetch_hostfile(str(path))
    assert pool == {"hostname1": 8, "hostname2": 8}
    assert list(pool) == ["hostname1", "hostname2"]


def test_missing_hostfile_means_no_pool(tmp_path):
    assert fetch_hostfile(str(tmp_path / "nope")) is None


@pytest.mark.parametrize("lines, problem, line_no", [
    (["worker-1 slots=4", "worker-1 slots=2"], "multiple entries for worker-1", "line 2"),
    (["worker-1"], "bad entry", "line 1"),
    (["worker-1 slots=4", "worker-2 gpus=4"], "bad entry", "line 2"),
    (["worker-1 slots=four"], "'four'", "line 1"),
    (["worker-1 slots=0"], "not a positive integer", "line 1"),
    (["worker-1 slots=-2"], "not a positive integer", "line 1"),
    (["worker-1 slots=2 extra"], "bad entry", "line 1"),
])
def test_bad_hostfiles_name_file_line_and_problem(lines, problem, line_no):
    with pytest.raises(ValueError) as err:
        parse_hostfile(lines, source="my_hosts")
    message = str(err.value)
    assert problem in message and line_no in message and "my_hosts" in message


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_hostfile_is_an_error(tmp_path, text):
    path = tmp_path / "hostfile"
    path.write_text(text)
    with pytest.raises(ValueError, match="empty or not formatted correctly") as err:
        fetch_hostfile(str(path))
    assert str(path) in str(err.value)


POOL = OrderedDict([("worker-0", 4), ("worker-1", 4), ("worker-2", 2)])


@pytest.mark.parametrize("include, expected", [
    ("worker-1", {"worker-1": [0, 1, 2, 3]}),
    ("worker-1:0", {"worker-1": [0]}),
    ("worker-2:0@worker-0:3,1", {"worker-0": [1, 3], "worker-2": [0]}),
    ("worker-0:1@worker-0:2", {"worker-0": [1, 2]}),
    ("worker-0@worker-0:2", {"worker-0": [0, 1, 2, 3]}),
])
def test_include(include, expected):
    active = parse_inclusion_exclusion(POOL, include, "")
    assert active == expected
    assert list(active) == [h for h in POOL if h in expected]  # hostfile order, not filter order


@pytest.mark.parametrize("exclude, expected", [
    ("worker-1", {"worker-0": [0, 1, 2, 3], "worker-2": [0, 1]}),
    ("worker-0:0,3@worker-2:1", {"worker-0": [1, 2], "worker-1": [0, 1, 2, 3], "worker-2": [0]}),
    ("worker-2:0,1", {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}),
])
def test_exclude(exclude, expected):
    assert parse_inclusion_exclusion(POOL, "", exclude) == expected


def test_no_filter_returns_every_slot():
    assert parse_inclusion_exclusion(POOL, "", "") == {
        "worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3], "worker-2": [0, 1]}


@pytest.mark.parametrize("include, exclude, message", [
    ("worker-0", "worker-1", "mutually exclusive"),
    ("worker-9", "", "Hostname 'worker-9' not found in hostfile"),
    ("", "worker-9:0", "Hostname 'worker-9' not found in hostfile"),
    ("worker-2:5", "", "No slot '5' specified on host 'worker-2'"),
    ("worker-0:x", "", "slot 'x' on host 'worker-0'"),
    ("worker-0@@worker-1", "", "empty node entry"),
    ("worker-0:", "", "slot '' on host 'worker-0'"),
    (":1", "", "no host name"),
    ("", "worker-0@worker-1@worker-2", "leaves no hosts or slots"),
])
def test_filter_errors(include, exclude, message):
    with pytest.raises(ValueError, match=message):
        parse_inclusion_exclusion(POOL, include, exclude)


def test_filter_does_not_mutate_input():
    host_info = OrderedDict([("a", [0, 1]), ("b", [0, 1])])
    parse_resource_filter(host_info, exclude_str="a:0")
    assert host_info == {"a": [0, 1], "b": [0, 1]}


def test_world_info_round_trip():
    active = OrderedDict([("worker-1", [0, 2]), ("worker-0", [1])])
    encoded = encode_world_info(active)
    assert encoded.replace("=", "").replace("-", "").replace("_", "").isalnum()
    decoded = decode_world_info(encoded)
    assert decoded == active and list(decoded) == ["worker-1", "worker-0"]


@pytest.mark.parametrize("bad", ["not base64!", encode_world_info({}), encode_world_info({"a": []}),
                                 encode_world_info({"a": ["0"]})])
def test_bad_world_info(bad):
    with pytest.raises(ValueError, match="world_info"):
        decode_world_info(bad)
