"""CPU core lists and NUMA topology for `--bind_cores_to_rank`.

Several CPU ranks on one machine fight over cores and memory bandwidth unless each is pinned to
its own cores (and its memory to the matching NUMA node). This module decides which cores each
local rank gets and how to pin it: a `numactl` prefix when numactl is installed, else an affinity
mask the launcher applies in the child before exec.
"""
import glob
import os
import re
import shutil

_NODE_DIR = "/sys/devices/system/node"
_CPU_DIR = "/sys/devices/system/cpu"


def parse_core_list(text, flag="--bind_core_list"):
    """Parse `0-13,28-41` style lists into an ascending list of distinct core ids.

    Raises ValueError naming the bad piece: a typo here would otherwise pin ranks to the wrong
    cores without any visible symptom except slowness.
    """
    if text is None or not str(text).strip():
        raise ValueError(f"{flag} is empty; expected a list like '0-13,28-41'")
    cores = []
    for piece in str(text).split(","):
        piece = piece.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", piece)
        if match is None:
            raise ValueError(f"{flag} {text!r}: {piece!r} is not a core id or an 'A-B' range")
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        if end < start:
            raise ValueError(f"{flag} {text!r}: range {piece!r} runs backwards")
        for core in range(start, end + 1):
            if core in cores:
                raise ValueError(f"{flag} {text!r}: core {core} is listed twice")
            cores.append(core)
    return sorted(cores)


def format_core_list(cores):
    """Render core ids compactly (`[0,1,2,5]` -> `0-2,5`), the form numactl and logs expect."""
    cores = sorted(cores)
    pieces = []
    start = prev = None
    for core in cores:
        if start is None:
            start = prev = core
        elif core == prev + 1:
            prev = core
        else:
            pieces.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = core
    if start is not None:
        pieces.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(pieces)


def available_cores():
    """Cores this process may run on (honours taskset/cgroup limits, unlike os.cpu_count())."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def physical_cores(cores):
    """Keep one hardware thread per physical core, so binding never puts two ranks on siblings."""
    chosen, seen = [], set()
    for core in cores:
        path = os.path.join(_CPU_DIR, f"cpu{core}", "topology", "thread_siblings_list")
        try:
            with open(path, encoding="ascii") as handle:
                siblings = tuple(parse_core_list(handle.read().strip(), flag=path))
        except (OSError, ValueError):
            siblings = (core,)
        if siblings not in seen:
            seen.add(siblings)
            chosen.append(core)
    return chosen


def numa_nodes():
    """`{node id: [cores]}` from sysfs; empty when the kernel does not expose NUMA topology."""
    nodes = {}
    for path in glob.glob(os.path.join(_NODE_DIR, "node[0-9]*", "cpulist")):
        node = int(os.path.basename(os.path.dirname(path))[4:])
        with open(path, encoding="ascii") as handle:
            text = handle.read().strip()
        if text:
            nodes[node] = parse_core_list(text, flag=path)
    return dict(sorted(nodes.items()))


def split_cores(cores, num_ranks):
    """Give each of `num_ranks` ranks an equal, contiguous share of `cores`, in order.

    Leftover cores (when the count does not divide evenly) stay idle: equal shares keep ranks in
    step, and a rank with an extra core would not make the slowest rank any faster.
    """
    if num_ranks < 1:
        raise ValueError(f"cannot split cores across {num_ranks} ranks")
    per_rank = len(cores) // num_ranks
    if per_rank == 0:
        raise ValueError(
            f"cannot bind {num_ranks} ranks to {len(cores)} core(s) "
            f"({format_core_list(cores) or 'none'}); start fewer ranks or give more cores")
    return [list(cores[i * per_rank:(i + 1) * per_rank]) for i in range(num_ranks)]


def rank_core_assignment(num_local_ranks, core_list=None):
    """Cores for each local rank: from `core_list` text when given, else this machine's cores.

    Without a list, physical cores are preferred; hyperthread siblings are used only when there
    are fewer physical cores than ranks.
    """
    if core_list:
        cores = parse_core_list(core_list)
        allowed = set(available_cores())
        missing = [c for c in cores if c not in allowed]
        if missing:
            raise ValueError(
                f"--bind_core_list {core_list!r}: core(s) {format_core_list(missing)} are not "
                f"available to this process (available: {format_core_list(allowed)})")
    else:
        cores = available_cores()
        physical = physical_cores(cores)
        if len(physical) >= num_local_ranks:
            cores = physical
    return split_cores(cores, num_local_ranks)


def numactl_prefix(cores):
    """`numactl -C <cores> [-m <nodes>]` for one rank, or None when numactl is not installed."""
    numactl = shutil.which("numactl")
    if numactl is None:
        return None
    prefix = [numactl, "-C", format_core_list(cores)]
    nodes = sorted(node for node, node_cores in numa_nodes().items()
                   if set(cores) & set(node_cores))
    if nodes:
        prefix += ["-m", ",".join(str(n) for n in nodes)]
    return prefix
