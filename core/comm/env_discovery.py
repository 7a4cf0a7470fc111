"""Where RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT come from under each launcher.

`torch.distributed`'s `env://` rendezvous reads five variables that only torchrun and the
`deepspeed` launcher set. Under mpirun (Open MPI, MPICH, Intel MPI, MVAPICH), srun (SLURM), AzureML
or SageMaker the same facts are spelled differently, so they are translated here. Everything is a
pure function of an environment mapping (plus an injectable master-address resolver) so every
launcher family is unit-testable without MPI; `init_distributed` applies the result to os.environ.
"""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

REQUIRED_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
LOCALHOST = "127.0.0.1"


class DiscoveryError(ValueError):
    """The environment describes a distributed job but not enough of it to join the group."""


@dataclass(frozen=True)
class LauncherFamily:
    """The variable names one launcher family uses; the first present name of each tuple wins."""

    name: str
    rank: Sequence[str]
    size: Sequence[str]
    local_rank: Sequence[str]
    local_size: Sequence[str] = ()
    is_mpi: bool = True


# Checked in this order. MPI families come before SLURM because `mpirun` inside an `sbatch`
# allocation inherits the batch step's SLURM_PROCID=0 on every rank, while its own variables are
# per rank; under `srun --mpi=pmi2` both agree, so nothing is lost.
FAMILIES = (
    LauncherFamily("openmpi", ("OMPI_COMM_WORLD_RANK",), ("OMPI_COMM_WORLD_SIZE",),
                   ("OMPI_COMM_WORLD_LOCAL_RANK",), ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
    LauncherFamily("mpich/intel-mpi", ("PMI_RANK",), ("PMI_SIZE",),
                   ("MPI_LOCALRANKID",), ("MPI_LOCALNRANKS",)),
    LauncherFamily("mvapich", ("MV2_COMM_WORLD_RANK",), ("MV2_COMM_WORLD_SIZE",),
                   ("MV2_COMM_WORLD_LOCAL_RANK",), ("MV2_COMM_WORLD_LOCAL_SIZE",)),
    LauncherFamily("slurm", ("SLURM_PROCID",), ("SLURM_NTASKS", "SLURM_NPROCS"),
                   ("SLURM_LOCALID",), (), is_mpi=False),
)


@dataclass
class Discovery:
    """What discovery found: the launcher, the variables it adds, and notes worth logging."""

    launcher: str
    values: dict = field(default_factory=dict)  # only the variables that were missing
    notes: list = field(default_factory=list)  # where values came from (logged when verbose)
    warnings: list = field(default_factory=list)  # gaps the job may trip over later

    def describe(self):
        shown = ", ".join(f"{k}={v}" for k, v in sorted(self.values.items())) or "nothing missing"
        return f"launcher={self.launcher}: {shown}"


def _first(env, names):
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            return name, value
    return None, None


def _int(env_name, value):
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DiscoveryError(f"{env_name}={value!r} is not an integer") from None


def detect_family(env: Mapping[str, str]) -> Optional[LauncherFamily]:
    """The first launcher family whose rank and world-size variables are both present."""
    for family in FAMILIES:
        if _first(env, family.rank)[0] and _first(env, family.size)[0]:
            return family
    return None


def missing_vars(env: Mapping[str, str]):
    return [name for name in REQUIRED_VARS if env.get(name) in (None, "")]


# ----------------------------------------------------------------------------- SLURM host lists
def _split_top_level(text):
    """Split on the commas that are not inside a bracket group."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in SLURM node list {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in SLURM node list {text!r}")
    parts.append("".join(current))
    return [part.strip() for part in parts if part.strip()]


def _expand_range_list(body, whole):
    values = []
    for item in body.split(","):
        item = item.strip()
        low, sep, high = item.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"bad range {item!r} in SLURM node list {whole!r}: "
                             "expected N or N-M with decimal digits")
        if not sep:
            values.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"descending range {item!r} in SLURM node list {whole!r}")
        width = len(low)  # SLURM pads every number to the width of the lower bound
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def _expand_host(pattern, whole):
    start = pattern.find("[")
    if start < 0:
        return [pattern]
    end = pattern.find("]", start)
    prefix, body, rest = pattern[:start], pattern[start + 1:end], pattern[end + 1:]
    tails = _expand_host(rest, whole)
    return [prefix + value + tail for value in _expand_range_list(body, whole) for tail in tails]


def expand_nodelist(nodelist: str):
    """SLURM hostlist syntax: `node[01-03,7],gpu5` -> node01, node02, node03, node7, gpu5.

    Written here rather than shelling out to `scontrol show hostnames` so discovery works on any
    node, including ones without SLURM's client tools.
    """
    if not nodelist or not nodelist.strip():
        raise ValueError("empty SLURM node list")
    hosts = []
    for pattern in _split_top_level(nodelist.strip()):
        hosts.extend(_expand_host(pattern, nodelist))
    return hosts


# ----------------------------------------------------------------------------- master address
def _master_from_env(env, family):
    """MASTER_ADDR from launcher-specific variables as (address, source), or (None, None)."""
    # Inside a SLURM allocation rank 0 runs on the first node, for srun (block layout) and for
    # an mpirun started from the batch script alike.
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(name):
            return expand_nodelist(env[name])[0], f"first host of {name}"
    if family is not None and family.name == "slurm":
        if env.get("SLURM_LAUNCH_NODE_IPADDR"):
            return env["SLURM_LAUNCH_NODE_IPADDR"], "SLURM_LAUNCH_NODE_IPADDR"
    # AzureML runs its jobs through Open MPI and names the master node itself
    for name in ("AZ_BATCH_MASTER_NODE", "AZ_BATCHAI_MPI_MASTER_NODE"):
        if env.get(name):
            # "host:port": the port is AzureML's own; ours is distributed_port
            return env[name].partition(":")[0], name
    # SageMaker lists its hosts as JSON; the first one hosts rank 0
    if env.get("SM_HOSTS"):
        try:
            hosts = json.loads(env["SM_HOSTS"])
        except json.JSONDecodeError as exc:
            raise DiscoveryError(
                f"SM_HOSTS={env['SM_HOSTS']!r} is not a JSON list: {exc}") from None
        if not isinstance(hosts, list) or not hosts:
            raise DiscoveryError(f"SM_HOSTS={env['SM_HOSTS']!r} should be a non-empty JSON list")
        return str(hosts[0]), "first host of SM_HOSTS"
    return None, None


def _single_node(env, family, world_size):
    if world_size == 1:
        return True
    if family is None:
        return False
    if family.name == "slurm":
        _, nodes = _first(env, ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"))
        return nodes == "1"
    name, local_size = _first(env, family.local_size)
    return name is not None and _int(name, local_size) == world_size


def discover(env: Mapping[str, str], distributed_port: int = 29500,
             master_addr_resolver: Optional[Callable[[], Optional[str]]] = None) -> Discovery:
    """Fill whichever of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT `env` lacks.

    Variables already present always win. With no launcher variables at all the process is a
    world of one. `master_addr_resolver` is consulted only for a multi-node job whose master the
    environment does not name (the caller passes an mpi4py broadcast when mpi4py is importable).
    """
    missing = missing_vars(env)
    if not missing:
        launcher = "torchrun" if env.get("TORCHELASTIC_RUN_ID") else "deepspeed launcher or caller"
        return Discovery(launcher=launcher)
    family = detect_family(env)
    if family is not None:
        found = Discovery(launcher=family.name)
    elif env.get("RANK") or env.get("WORLD_SIZE"):
        found = Discovery(launcher="caller's RANK/WORLD_SIZE")
    else:
        found = Discovery(launcher="none (single process)")

    def pick(own, names):
        if env.get(own) not in (None, ""):
            return own, env[own]
        if family is not None:
            return _first(env, names)
        return None, None

    rank_name, rank = pick("RANK", family.rank if family else ())
    size_name, size = pick("WORLD_SIZE", family.size if family else ())
    if size is None:
        if rank is not None and _int(rank_name, rank) != 0:
            raise DiscoveryError(f"{rank_name}={rank} is set but WORLD_SIZE is not, and no "
                                 f"launcher variables were found ({_family_hint()})")
        size_name, size = "default", "1"
    if rank is None:
        if _int(size_name, size) != 1:
            raise DiscoveryError(f"WORLD_SIZE={size} is set but RANK is not, and no launcher "
                                 f"variables were found ({_family_hint()})")
        rank_name, rank = "default", "0"
    rank_i, size_i = _int(rank_name, rank), _int(size_name, size)
    if size_i < 1 or not 0 <= rank_i < size_i:
        raise DiscoveryError(f"rank {rank_i} (from {rank_name}) is outside a world of {size_i} "
                             f"(from {size_name})")
    values = {"RANK": str(rank_i), "WORLD_SIZE": str(size_i)}

    local_name, local = pick("LOCAL_RANK", family.local_rank if family else ())
    if local is None and _single_node(env, family, size_i):
        local_name, local = "single node", str(rank_i)
    if local is not None:
        values["LOCAL_RANK"] = str(_int(local_name, local))
    else:
        found.warnings.append("LOCAL_RANK could not be derived: code that needs it "
                              "(zero.Init, device placement) fails until the launcher exports it")

    if env.get("MASTER_ADDR"):
        addr, addr_source = env["MASTER_ADDR"], "MASTER_ADDR"
    else:
        addr, addr_source = _master_from_env(env, family)
    if addr is None and _single_node(env, family, size_i):
        addr, addr_source = LOCALHOST, "single node"
    if addr is None and master_addr_resolver is not None:
        addr, addr_source = master_addr_resolver(), "mpi4py broadcast from rank 0"
    if addr is None:
        raise DiscoveryError(
            f"cannot tell the master address of this {size_i}-rank {found.launcher} job: export "
            "MASTER_ADDR (the host of rank 0) or install mpi4py so rank 0 can broadcast it")
    values["MASTER_ADDR"] = addr
    values["MASTER_PORT"] = env.get("MASTER_PORT") or str(distributed_port)
    if addr_source != "MASTER_ADDR":
        found.notes.append(f"MASTER_ADDR={addr} from {addr_source}")

    found.values = {key: value for key, value in values.items() if key in missing}
    return found


def _family_hint():
    names = ", ".join(f"{f.name} ({f.rank[0]}/{f.size[0]})" for f in FAMILIES)
    return f"looked for {names}"


def mpi4py_master_addr():
    """Rank 0's address broadcast over MPI; None when mpi4py is not importable.

    Every rank reaches this call under the same conditions (same variables missing), so the
    broadcast is collective as MPI requires.
    """
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    addr = socket.gethostbyname(socket.gethostname()) if comm.Get_rank() == 0 else None
    return comm.bcast(addr, root=0)
