"""CPU core lists and NUMA topology (`deepspeed.utils.numa`), for `--bind_cores_to_rank`.

Several CPU ranks on one machine fight over cores and memory bandwidth unless each is pinned to
its own cores (and its memory to the matching NUMA node). This module decides which cores each
local rank gets and how to pin it: a `numactl` prefix when numactl is installed, else an affinity
mask the launcher applies in the child before exec. The functions at the end carry upstream's
names (`get_numa_cores`, `parse_range_list`, `get_numactl_cmd`, ...) for launch scripts written
against it. Standard library only: the launcher imports it in processes that never load torch.
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


def _numactl_command(numactl, cores):
    """`<numactl> -C <cores> [-m <the NUMA nodes holding them>]`."""
    command = [numactl, "-C", format_core_list(cores)]
    nodes = sorted(node for node, node_cores in numa_nodes().items()
                   if set(cores) & set(node_cores))
    if nodes:
        command += ["-m", ",".join(str(n) for n in nodes)]
    return command


def numactl_prefix(cores):
    """`numactl -C <cores> [-m <nodes>]` for one rank, or None when numactl is not installed."""
    numactl = shutil.which("numactl")
    return None if numactl is None else _numactl_command(numactl, cores)


# ---------------------------------------------------------------- upstream's names
def get_numa_cores():
    """The cores of each NUMA node, node by node (`[[0, 1, ...], [28, 29, ...]]`); one list of
    every available core when the kernel exposes no NUMA topology."""
    nodes = numa_nodes()
    return list(nodes.values()) if nodes else [available_cores()]


def check_for_numactl_pkg():
    """Whether `numactl` is installed; when not, says how to install it and returns False."""
    if shutil.which("numactl") is not None:
        return True
    print("numactl is not installed; install it for NUMA-aware core binding "
          "(e.g. 'apt-get install numactl' or 'yum install numactl')")
    return False


def parse_range(rng):
    """`"3-5"` -> `[3, 4, 5]`, `"7"` -> `[7]`."""
    return parse_core_list(rng, flag="range")


def parse_range_list(range_str):
    """`"0-3,8,10-11"` -> the ascending distinct core ids; a core listed twice is an error."""
    return parse_core_list(range_str, flag="range list")


def get_numactl_cmd(bind_core_list, num_local_procs, local_rank):
    """`(cores per rank, ["numactl", "-C", <this rank's cores>, "-m", <their nodes>])` for local
    rank `local_rank` of `num_local_procs`, sharing out `bind_core_list` (text like `"0-13"`, or
    None for this machine's cores) as `--bind_cores_to_rank` does."""
    if not 0 <= local_rank < num_local_procs:
        raise ValueError(f"local_rank {local_rank} is not one of {num_local_procs} local ranks")
    cores = rank_core_assignment(num_local_procs, bind_core_list)[local_rank]
    return len(cores), _numactl_command("numactl", cores)
