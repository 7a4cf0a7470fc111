"""``ds_ssh``: the command runs once on every hostfile host (through pdsh when it is on PATH,
else one ssh per host), each output line names its host, and a failing host fails the command."""
import os

import pytest
from fake_cluster import FakeCluster

from deepspeed.launcher.ds_ssh import main


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    with FakeCluster(tmp_path / "cluster", use_netns=False) as fake:
        monkeypatch.setenv("PATH", fake.env(dict(os.environ))["PATH"])
        yield fake


@pytest.mark.parametrize("via", ["pdsh", "ssh"])
def test_runs_on_every_host_and_reports_the_worst_status(cluster, tmp_path, capfd, via):
    if via == "ssh":  # without pdsh on PATH ds_ssh opens one ssh per host itself
        (cluster.bin_dir / "pdsh").unlink(missing_ok=True)
    elif not (cluster.bin_dir / "pdsh").exists():
        pytest.skip("a real pdsh is installed; the fake cluster's hosts are only reachable by the fake one")
    hostfile = cluster.hostfile(tmp_path / "hostfile", slots=2)
    assert main(["-f", hostfile, "echo", "on=$DS_FAKE_NODE"]) == 0
    lines = sorted(line for line in capfd.readouterr().out.splitlines() if "on=" in line)
    assert lines == [f"{host}: on={host}" for host in sorted(cluster.hosts)]

    last = cluster.hosts[-1]
    assert main(["-f", hostfile, f"test $DS_FAKE_NODE != {last} || exit 3"]) == 3
    assert last in capfd.readouterr().err


def test_bad_hostfile_and_missing_command(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        main(["-f", str(tmp_path / "nope"), "true"])
    bad = tmp_path / "bad"
    bad.write_text("worker-1 slots=two\n")
    with pytest.raises(SystemExit, match="line 1"):
        main(["-f", str(bad), "true"])
    with pytest.raises(SystemExit):
        main(["-f", str(bad)])
