"""`python -m deepspeed.launcher.rank_guard -- PROGRAM...`: run one MPI/SLURM-started rank and,
if it dies, say which rank it was, and give it its share of the node's cores.

pdsh and `--no_ssh` start workers through the per-node launcher, which names a failed rank. MPI
launchers and srun start the workers themselves and report a death by pid and host at best
(MPICH: "PID 2943 RUNNING AT node-2"), so the multi-node runner wraps each worker in this guard.
The guard stays out of the way: the worker inherits its stdio, every open file descriptor (the
PMI connection of MPICH) and its environment; SIGINT/SIGTERM are passed on; the worker is killed
if the guard dies first (Linux parent-death signal); the exit status is the worker's, as a shell
reports it, so the MPI launcher still sees the failure and tears the job down.

Threads: the per-node launcher gives each of its workers OMP_NUM_THREADS = the node's cores /
its ranks, unless the user set the variable; ranks started by an MPI launcher or srun get the
same rule here, from the launcher's local-size variable (without it, on two ranks of a 2-core
node each torch process runs two threads, and OpenMP's spinning between parallel regions
slowed each training step of the README demo from ~0.05 s to ~1 s).
"""
import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys

from deepspeed.launcher.launch import describe_exit, shell_exit_code
from deepspeed.utils import numa as core_binding
from deepspeed.utils.logging import logger

# the variable each launcher family uses for the global rank, in the order env discovery reads them
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")
# ... and for the number of ranks on this node (the deepspeed runner's own, then the launchers')
LOCAL_SIZE_VARIABLES = ("LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                        "MV2_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")
_PR_SET_PDEATHSIG = 1


def rank_of(env):
    """(rank, the variable it came from), or ("?", None) when no launcher variable is set."""
    for name in RANK_VARIABLES:
        if env.get(name, "") != "":
            return env[name], name
    return "?", None


def thread_share(env, cores):
    """OMP_NUM_THREADS for this rank: ``cores`` / the ranks on this node, as the per-node
    launcher gives its workers; None when the user set it or no variable names the node's rank
    count."""
    if env.get("OMP_NUM_THREADS", "") != "":
        return None
    for name in LOCAL_SIZE_VARIABLES:
        value = env.get(name, "")
        if value.isdigit() and int(value) > 0:
            return str(max(1, cores // int(value)))
    return None


def _die_with_parent(parent):
    """Run in the worker between fork and exec: SIGKILL when the guard (``parent``) dies. A
    guard killed before this armed the signal would never send it, so the worker also ends
    itself if its parent is already gone (seen: a guard killed right after it forked)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the MPI launcher's own cleanup remains
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m deepspeed.launcher.rank_guard -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    rank, source = rank_of(os.environ)
    worker, pending = [], []

    def forward(signum, _frame):
        # installed before the worker starts, so an early SIGTERM is kept, not fatal to the guard
        if not worker:
            pending.append(signum)
        elif worker[0].poll() is None:
            worker[0].send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    env = dict(os.environ)
    threads = thread_share(env, len(core_binding.available_cores()))
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    try:
        proc = subprocess.Popen(argv, close_fds=False, env=env,
                                preexec_fn=functools.partial(_die_with_parent, os.getpid()))
    except OSError as err:
        logger.error(f"rank {rank} could not start {argv[0]!r}: {err}")
        return 127
    worker.append(proc)
    for signum in pending:
        proc.send_signal(signum)
    returncode = proc.wait()
    if returncode != 0:
        where = f"from {source}, " if source else ""
        logger.error(f"rank {rank} ({where}pid {proc.pid} on {socket.gethostname()}) "
                     f"{describe_exit(returncode)}; command: {' '.join(argv)}")
    return shell_exit_code(returncode)


if __name__ == "__main__":
    sys.exit(main())
