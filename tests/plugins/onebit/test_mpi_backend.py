"""The MPI backend (``comm_backend_name: "mpi"``) under a real ``mpirun -np 2``, when the
``deepspeed[1bit]`` extra (mpi4py + MPICH) is installed; skipped with the install hint otherwise."""
import os
import shutil
import subprocess
import sys

import pytest

from deepspeed.onebit.transports import INSTALL_HINT

HERE = os.path.dirname(os.path.abspath(__file__))


def _mpirun():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip(f"mpi4py is not installed: {INSTALL_HINT}")
    local = os.path.join(os.path.dirname(sys.executable), "mpirun")
    found = local if os.path.exists(local) else shutil.which("mpirun")
    if found is None:
        pytest.skip(f"no mpirun on PATH: {INSTALL_HINT}")
    return found


@pytest.mark.fresh_python  # MPI_Init talks to mpirun's process manager as the process it started
def test_mpi_backend_under_mpirun():
    mpirun = _mpirun()
    from deepspeed.testing.distributed import find_free_port

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    # the gloo rendezvous the ranks find through MPI discovery: not the default 29500, which
    # another job on the machine (a second mpirun, a launcher test) may hold
    env["MASTER_PORT"] = str(find_free_port())
    proc = subprocess.run([mpirun, "-np", "2", sys.executable, os.path.join(HERE, "mpi_checks.py")],
                          env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "MPI-OK 0" in out and "MPI-OK 1" in out, out[-4000:]
