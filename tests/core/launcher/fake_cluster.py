"""Two "nodes" on one machine for real multi-node launches, plus the remote-shell tools to reach them.

Where the test may create network namespaces (root, `ip netns` available), every node is its own
namespace with its own address on a private bridge (10.x.y.1, 10.x.y.2; the launching machine is
10.x.y.254), its own `/etc/hosts` (so the machine's hostname resolves to the node's address, as on
a real cluster), its own `/etc/resolv.conf` (a name server that answers at once) and an `eth0`. Otherwise the nodes are the loopback addresses 127.0.0.2 and
127.0.0.3 of this machine. Either way the hostfile names the nodes by address.

`ssh`, `srun` (and `pdsh` when the real one is not installed) are put on PATH as shims from
`fake_node_tools.py`: they start the *real* command line the launcher built on the named node, the
way the real tool would (a fresh login environment for ssh, SLURM's task variables for srun). A
host that is not a node is unreachable, as on a real network.
"""
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
TOOLS = HERE / "fake_node_tools.py"


def _run(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def netns_available():
    """True when this process may create network namespaces (checked by creating one)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    name = f"dsmprobe{secrets.token_hex(3)}"
    try:
        _run("ip", "netns", "add", name)
    except (subprocess.CalledProcessError, OSError):
        return False
    subprocess.run(["ip", "netns", "del", name], check=False)
    return True


def _used_subnets():
    out = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=False).stdout
    return {".".join(word.split("/")[0].split(".")[:3]) for word in out.split() if word.count(".") == 3}


class FakeCluster:
    """`hosts` (the hostfile names), `controller` (this machine as the nodes see it), `bin_dir`."""

    def __init__(self, root, num_nodes=2, use_netns=None):
        self.root = Path(root)
        self.bin_dir = self.root / "bin"
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        self.num_nodes = num_nodes
        self.use_netns = netns_available() if use_netns is None else use_netns
        self.token = secrets.token_hex(3)  # interface names stay within 15 characters
        self.namespaces = {}
        self._links = []
        self._etc_dirs = []
        self._warm_servers = []
        if self.use_netns:
            try:
                self._create_namespaces()
            except (subprocess.CalledProcessError, OSError):
                # e.g. namespaces allowed but no bridge/veth support: fall back to loopback
                self.use_netns = False
        if not self.use_netns:
            # not 127.0.0.1: MPICH starts processes for a host it takes for this one without ssh
            self.hosts = [f"127.0.0.{i + 2}" for i in range(num_nodes)]
            self.controller = "127.0.0.1"
            self.namespaces = {host: "" for host in self.hosts}
        self.unreachable = "10.255.255.1" if self.use_netns else "192.0.2.1"  # TEST-NET-1
        self._write_tools()
        self._start_warm_servers()

    def _start_warm_servers(self):
        """Under the suite's --warm-python, one warm server per node (in the node's namespace,
        with its /etc files), as the machine has one: programs started on a node run warm."""
        from deepspeed.testing import warm_python

        for ns in self.namespaces.values():
            stop = warm_python.start_node_server(ns) if ns else None
            if stop is not None:
                self._warm_servers.append(stop)
        if self._warm_servers:
            self._wait_for_warm_servers(warm_python)

    def _wait_for_warm_servers(self, warm_python, timeout=120.0):
        """Until every node's server listens: a program started on a node before then runs in
        a fresh interpreter, so the first launches (their ranks at once) would each import
        torch beside the servers still importing it. The socket appears once the server's
        preloads are imported; it is named after the node's network namespace (inode of
        /run/netns/<name>), as start_node_server names it."""
        folder = os.environ[warm_python.ENV]
        paths = [os.path.join(folder, f"net-{os.stat(os.path.join('/run/netns', ns)).st_ino}.sock")
                 for ns in self.namespaces.values() if ns]
        deadline = time.monotonic() + timeout
        while not all(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
            time.sleep(0.1)

    @property
    def mode(self):
        return "netns" if self.use_netns else "loopback"

    # ---- network namespaces -------------------------------------------------------------------
    def _create_namespaces(self):
        used = _used_subnets()
        # a random free one: two clusters made at once (pytest-xdist workers, or two checkouts
        # testing on one machine) would otherwise both take the first free subnet
        subnet = secrets.choice([f"10.{a}.{b}" for a in range(200, 250) for b in range(1, 255)
                                 if f"10.{a}.{b}" not in used])
        prefix = f"dsm{self.token}"
        bridge = f"{prefix}br"
        self.hosts = [f"{subnet}.{i + 1}" for i in range(self.num_nodes)]
        self.controller = f"{subnet}.254"
        hostname = os.uname().nodename
        try:
            _run("ip", "link", "add", bridge, "type", "bridge")
            self._links.append(bridge)
            _run("ip", "addr", "add", f"{self.controller}/24", "dev", bridge)
            _run("ip", "link", "set", bridge, "up")
            for i, host in enumerate(self.hosts):
                ns, outer = f"{prefix}n{i}", f"{prefix}h{i}"
                # the node's own /etc/hosts (bind-mounted by `ip netns exec`): this machine's
                # hostname is the node's address, so gloo and MPI pick the node's interface
                etc = Path("/etc/netns") / ns
                etc.mkdir(parents=True, exist_ok=True)
                self._etc_dirs.append(etc)
                peers = "".join(f"{peer} dsnode{j}\n" for j, peer in enumerate(self.hosts) if peer != host)
                (etc / "hosts").write_text(f"127.0.0.1 localhost\n{host} {hostname}\n{peers}"
                                           f"{self.controller} dslauncher\n")
                # and its own resolver: the machine's name server is not reachable from a node,
                # so every lookup /etc/hosts cannot answer (c10d's reverse lookup of each
                # IPv6-mapped peer address on connect) would wait 2 x 5 s for DNS to time out;
                # on 127.0.0.1, where nothing listens, it is refused at once
                (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
                _run("ip", "netns", "add", ns)
                self.namespaces[host] = ns
                _run("ip", "link", "add", outer, "type", "veth", "peer", "name", f"{prefix}v{i}")
                self._links.append(outer)
                _run("ip", "link", "set", f"{prefix}v{i}", "netns", ns)
                _run("ip", "-n", ns, "link", "set", f"{prefix}v{i}", "name", "eth0")
                _run("ip", "-n", ns, "addr", "add", f"{host}/24", "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                _run("ip", "-n", ns, "route", "add", "default", "via", self.controller)
                _run("ip", "link", "set", outer, "master", bridge)
                _run("ip", "link", "set", outer, "up")
        except Exception:
            self.close()
            raise

    def close(self):
        for stop in self._warm_servers:
            stop()
        self._warm_servers = []
        for ns in self.namespaces.values():
            if ns:
                subprocess.run(["ip", "netns", "del", ns], check=False, stderr=subprocess.DEVNULL)
        for link in self._links:
            subprocess.run(["ip", "link", "del", link], check=False, stderr=subprocess.DEVNULL)
        for etc in self._etc_dirs:
            shutil.rmtree(etc, ignore_errors=True)
        self.namespaces = {}
        self._links = []
        self._etc_dirs = []

    # ---- tools on PATH ------------------------------------------------------------------------
    def _write_tools(self):
        (self.bin_dir / "cluster.json").write_text(json.dumps(self.namespaces))
        tools = ["ssh", "srun"] + ([] if shutil.which("pdsh") else ["pdsh"])
        for tool in tools:
            path = self.bin_dir / tool
            path.write_text(f"#!/bin/sh\nexec {sys.executable} {TOOLS} {self.bin_dir / 'cluster.json'} "
                            f"{tool} \"$@\"\n")
            path.chmod(0o755)

    def hostfile(self, path, slots=1, hosts=None):
        lines = "".join(f"{host} slots={slots}\n" for host in (hosts or self.hosts))
        Path(path).write_text(lines)
        return str(path)

    def env(self, base):
        """`base` with the shims and this interpreter's bin dir (mpirun) first on PATH."""
        env = dict(base)
        env["PATH"] = os.pathsep.join([str(self.bin_dir), os.path.dirname(sys.executable),
                                       base.get("PATH", os.defpath)])
        return env

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
