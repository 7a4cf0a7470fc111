"""`python -m deepspeed.launcher.rank_guard -- PROGRAM...`: run one MPI/SLURM-started rank and,
if it dies, say which rank it was.

pdsh and `--no_ssh` start workers through the per-node launcher, which names a failed rank. MPI
launchers and srun start the workers themselves and report a death by pid and host at best
(MPICH: "PID 2943 RUNNING AT node-2"), so the multi-node runner wraps each worker in this guard.
The guard stays out of the way: the worker inherits its stdio, every open file descriptor (the
PMI connection of MPICH) and its environment; SIGINT/SIGTERM are passed on; the worker is killed
if the guard dies first (Linux parent-death signal); the exit status is the worker's, as a shell
reports it, so the MPI launcher still sees the failure and tears the job down.
"""
import ctypes
import os
import signal
import socket
import subprocess
import sys

from deepspeed.launcher.launch import describe_exit, shell_exit_code
from deepspeed.utils.logging import logger

# the variable each launcher family uses for the global rank, in the order env discovery reads them
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")
_PR_SET_PDEATHSIG = 1


def rank_of(env):
    """(rank, the variable it came from), or ("?", None) when no launcher variable is set."""
    for name in RANK_VARIABLES:
        if env.get(name, "") != "":
            return env[name], name
    return "?", None


def _die_with_parent():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the MPI launcher's own cleanup remains
        pass


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
    try:
        proc = subprocess.Popen(argv, close_fds=False, preexec_fn=_die_with_parent)
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
