"""init_distributed: backend choice, launcher discovery, adoption, repeated calls, timeouts."""
import logging
import os
import time
from datetime import timedelta

import pytest
import torch

from deepspeed.comm import initialization
from deepspeed.comm.env_discovery import REQUIRED_VARS
from deepspeed.testing.distributed import run_distributed


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelname, record.getMessage()))


def _capture_logs():
    from deepspeed.utils.logging import logger

    handler = _Collect()
    logger.addHandler(handler)
    return handler


# --------------------------------------------------------------------------- in this process
def test_timeout_must_be_a_timedelta():
    with pytest.raises(AssertionError, match="timedelta"):
        initialization.init_distributed(timeout=30)


def test_dist_init_required_false_needs_an_existing_group():
    assert not torch.distributed.is_initialized()
    with pytest.raises(AssertionError) as info:
        initialization.init_distributed(dist_init_required=False)
    assert str(info.value) == ("Distributed backend is not initialized. Please set "
                               "dist_init_required to True or initialize before calling "
                               "deepspeed.initialize()")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only nccl -> gloo mapping")
def test_backend_defaults_to_gloo_and_nccl_falls_back_on_cpu():
    assert initialization.resolve_backend(None) == "gloo"
    assert initialization.resolve_backend("nccl") == "gloo"
    assert initialization.resolve_backend("gloo") == "gloo"


def test_unknown_backend_is_named_in_the_error():
    with pytest.raises(ValueError, match=r"'carrier-pigeon'.*available here: \[.*gloo"):
        initialization.resolve_backend("carrier-pigeon")


def test_tcp_init_method_needs_rank_and_world_size(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="needs an explicit rank="):
        initialization._rank_args("tcp://127.0.0.1:1234", -1, 2)
    assert initialization._rank_args("tcp://127.0.0.1:1234", 1, 2) == {"rank": 1, "world_size": 2}


# --------------------------------------------------------------------------- in fresh ranks
def _rank_adopts_user_group():
    import torch.distributed as torch_dist  # the test plays a user who initialised torch itself

    import deepspeed.comm as dist

    logs = _capture_logs()
    torch_dist.init_process_group("gloo")
    user_group = torch_dist.group.WORLD
    dist.init_distributed(verbose=False)  # adopts
    dist.init_distributed()  # a second call: no-op
    dist.init_distributed(dist_init_required=True)  # forcing on an existing group: no-op too
    t = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return {"same_group": torch_dist.group.WORLD is user_group, "sum": t.tolist(),
            "backend": dist.get_backend(), "logs": logs.records}


def test_a_group_the_user_initialised_is_adopted():
    for got in run_distributed(_rank_adopts_user_group, world_size=2, init=False):
        assert got == {"same_group": True, "sum": [3.0, 3.0], "backend": "gloo", "logs": []}


def _rank_joins_as_open_mpi_rank(backend):
    import deepspeed.comm as dist

    env = os.environ
    rank, size = env.pop("RANK"), env.pop("WORLD_SIZE")
    port = int(env.pop("MASTER_PORT"))
    env.pop("LOCAL_RANK")
    env.pop("MASTER_ADDR")
    env.update(OMPI_COMM_WORLD_RANK=rank, OMPI_COMM_WORLD_SIZE=size,
               OMPI_COMM_WORLD_LOCAL_RANK=rank, OMPI_COMM_WORLD_LOCAL_SIZE=size)
    logs = _capture_logs()
    dist.init_distributed(dist_backend=backend, distributed_port=port,
                          config={"comms_logger": {"enabled": True, "prof_ops": ["all_reduce"]}})
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    settings = dist.comms_logger_settings()
    return {"env": {name: env[name] for name in REQUIRED_VARS}, "port": port,
            "backend": dist.get_backend(), "sum": t.item(), "logs": logs.records,
            "comms_logger": (settings.enabled, settings.prof_ops)}


def test_open_mpi_variables_are_discovered_and_logged():
    backend = None if torch.cuda.is_available() else "nccl"  # on CPU: nccl maps to gloo
    results = run_distributed(_rank_joins_as_open_mpi_rank, world_size=2, init=False,
                              args=(backend,))
    for rank, got in enumerate(results):
        assert got["env"] == {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(got["port"])}
        assert got["sum"] == 1.0
        assert got["comms_logger"] == (True, ["all_reduce"])
        messages = " | ".join(message for _, message in got["logs"])
        assert "launcher=openmpi" in messages
        # said once per node: by local rank 0 only
        assert ("Initializing torch.distributed with backend 'gloo'" in messages) == (rank == 0)
        if backend == "nccl":
            assert got["backend"] == "gloo"
            assert ("WARNING", "dist_backend='nccl' needs CUDA, which this machine lacks; "
                               "using 'gloo'") in got["logs"]


def _rank_times_out_alone(flag_dir):
    import deepspeed.comm as dist

    port, rank = os.environ["MASTER_PORT"], int(os.environ["RANK"])
    for name in REQUIRED_VARS:
        del os.environ[name]
    dist.init_distributed(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                          timeout=timedelta(seconds=3), verbose=False)
    size = dist.get_world_size()
    dist.barrier()
    flag = os.path.join(flag_dir, "rank0-done")
    if rank == 1:  # stay alive (a dead peer is a different error) until rank 0 has timed out
        deadline = time.monotonic() + 120
        while not os.path.exists(flag):
            assert time.monotonic() < deadline, "rank 0 never reported its timeout"
            time.sleep(0.05)
        return {"size": size}
    errors = []
    ops = (("barrier", dist.barrier), ("all_reduce", lambda: dist.all_reduce(torch.ones(2))))
    for op, call in ops:
        try:
            call()
        except dist.CommTimeoutError as exc:
            errors.append((op, str(exc), exc.rank, exc.op, exc.group_size, exc.timeout,
                           type(exc.__cause__).__name__))
        else:
            errors.append((op, "no error"))
    open(flag, "w").close()
    return {"size": size, "errors": errors}


def test_a_collective_entered_by_one_rank_raises_comm_timeout_error(tmp_path):
    rank0, rank1 = run_distributed(_rank_times_out_alone, world_size=2, init=False,
                                   args=(str(tmp_path),))
    assert rank1 == {"size": 2}
    assert rank0["size"] == 2
    (barrier, message, *fields), (all_reduce, later_message, *later_fields) = rank0["errors"]
    assert fields == [0, "barrier", 2, timedelta(seconds=3), "RuntimeError"], message
    assert message.startswith("rank 0 timed out in barrier on a group of 2 rank(s) after 3 s")
    # the group is unusable after a timeout: later ops say so instead of waiting again
    assert later_fields == [0, "all_reduce", 2, timedelta(seconds=3), "RuntimeError"], later_message
    assert later_message.startswith("rank 0 cannot run all_reduce on a group of 2 rank(s): an "
                                    "earlier op on this group timed out (timeout 3 s)")


def _exit_hook_destroys_only_own_group(created_by):
    import torch.distributed as tdist

    from deepspeed import comm as dist

    import atexit

    atexit.unregister(initialization._settle_backend_at_exit)  # workers may be reused
    initialization._exit_hook_registered = False
    if created_by == "caller":
        tdist.init_process_group("gloo")
    dist.init_distributed()
    registered = initialization._exit_hook_registered
    initialization._settle_backend_at_exit()
    alive = tdist.is_initialized()
    if alive:
        tdist.destroy_process_group()
    return registered, alive


@pytest.mark.parametrize("created_by, survives", [("deepspeed", False), ("caller", True)])
def test_exit_hook_settles_every_group_and_destroys_only_its_own(created_by, survives):
    """The settle runs whoever created the group (Accelerate creates its own on CPU, and the
    gloo exit race does not care); only the group deepspeed.comm created is destroyed."""
    results = run_distributed(_exit_hook_destroys_only_own_group, world_size=2, init=False,
                              args=(created_by,))
    assert results == [(True, survives), (True, survives)]


def test_a_busy_master_port_is_named_with_the_flag_that_changes_it():
    import socket
    import subprocess
    import sys

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
               WORLD_SIZE="1", LOCAL_RANK="0")
    code = ("from datetime import timedelta\n"
            "from deepspeed import comm\n"
            "comm.init_distributed(dist_backend='gloo', timeout=timedelta(seconds=20))\n")
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=120)
    finally:
        holder.close()
    assert done.returncode != 0
    assert f"MASTER_PORT={port}" in done.stderr and "--master_port" in done.stderr, done.stderr
    assert "address already in use" in done.stderr
