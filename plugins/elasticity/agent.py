"""``deepspeed --elastic_training``: this node's workers under torch elastic.

The node joins a c10d rendezvous at ``--master_addr:--master_port`` (node rank 0 hosts its
store) with ``--min_elastic_nodes`` to ``--max_elastic_nodes`` nodes, and torch's
``LocalElasticAgent`` supervises the workers: when a worker fails (a peer node died mid
collective) the agent restarts them with whoever is left, and when a new node waits to join it
restarts them with the larger group, once ``elasticity.min_time`` minutes have passed since
the last start (``min_time.py``, read from the script's ``--deepspeed_config``). Each start is a fresh ``deepspeed.initialize``, whose
batch sizes come from the ``elasticity`` section for the new world size, so the global batch
stays what the elastic plan says; the script resumes from its latest checkpoint.

Every node is started by its own command (``--no_ssh --node_rank i``, as torchrun);
multi-node launchers (pdsh, MPI, SLURM) are not used for elastic jobs.
"""
import os
import sys


from deepspeed.elasticity.min_time import BACKEND as MIN_TIME_BACKEND
from deepspeed.elasticity.min_time import MIN_TIME_KEY, min_time_from_args, register_backend
from deepspeed.utils.logging import logger

MAX_RESTARTS_ENV = "DS_ELASTIC_MAX_RESTARTS"  # restarts after failures (default 10)
LAST_CALL_ENV = "DS_ELASTIC_LAST_CALL_TIMEOUT"  # s to wait for more nodes once min joined (2)
# s between a node's rendezvous heartbeats (1); a node silent for KEEP_ALIVE_ATTEMPTS of them is
# dead. torch's 5 s x 3 kept the survivors of a dead node waiting 15 s before re-forming the
# group; the heartbeat comes from the agent's own thread, not the busy worker, so 1 s x 5 is safe
KEEP_ALIVE_ENV = "DS_ELASTIC_KEEP_ALIVE_INTERVAL"
KEEP_ALIVE_ATTEMPTS = 5


def _int_env(name, default):
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"${name}={value!r} is not an integer") from None


def elastic_plan(args):
    """(launch config kwargs, program, program args) for this node; pure apart from the
    resource lookup, so ``--dry_run`` can print it."""
    from deepspeed.launcher.runner import LauncherError, resolve_resources

    env = dict(os.environ)
    _pool, active = resolve_resources(args, env)
    hosts = list(active)
    if len(hosts) > 1 and not args.no_ssh:
        raise LauncherError(
            "--elastic_training starts one node's workers per command: run the same command on "
            "every node with --no_ssh --node_rank <i> (as torchrun); the pdsh/MPI/SLURM "
            "launchers are not used for elastic jobs")
    if args.no_local_rank:
        raise ValueError("--no_local_rank is not supported with --elastic_training")
    node_rank = max(args.node_rank, 0)
    host = hosts[node_rank] if node_rank < len(hosts) else hosts[0]
    min_nodes = args.min_elastic_nodes if args.min_elastic_nodes > 0 else 1
    max_nodes = args.max_elastic_nodes if args.max_elastic_nodes > 0 else max(len(hosts),
                                                                             min_nodes)
    if max_nodes < min_nodes:
        raise ValueError(f"--max_elastic_nodes ({max_nodes}) is smaller than "
                         f"--min_elastic_nodes ({min_nodes})")
    master_addr = args.master_addr or (hosts[0] if len(hosts) > 1 else "127.0.0.1")
    rdzv_configs = {"last_call_timeout": _int_env(LAST_CALL_ENV, 2), "join_timeout": 900,
                    "keep_alive_interval": _int_env(KEEP_ALIVE_ENV, 1),
                    "keep_alive_max_attempt": KEEP_ALIVE_ATTEMPTS}
    backend = "c10d"
    min_time_s = min_time_from_args(args.user_args)  # elasticity.min_time, as seconds
    if min_time_s > 0:  # c10d, holding waiting nodes back for min_time after each start
        backend, rdzv_configs[MIN_TIME_KEY] = MIN_TIME_BACKEND, min_time_s
    if args.node_rank >= 0:  # otherwise torch decides (the first agent to bind the port hosts)
        rdzv_configs["is_host"] = args.node_rank == 0
    launch = dict(min_nodes=min_nodes, max_nodes=max_nodes, nproc_per_node=len(active[host]),
                  run_id=os.environ.get("DS_ELASTIC_RUN_ID", f"deepspeed-{args.master_port}"),
                  rdzv_backend=backend, rdzv_endpoint=f"{master_addr}:{args.master_port}",
                  rdzv_configs=rdzv_configs, max_restarts=_int_env(MAX_RESTARTS_ENV, 10),
                  monitor_interval=0.5, start_method="spawn")
    if args.no_python:
        program, program_args = args.user_script, []
    else:
        program = sys.executable
        program_args = ["-u"] + (["-m"] if args.module else []) + [args.user_script]
    program_args += ["--local_rank=${local_rank}"] + list(args.user_args)
    return launch, program, program_args


def run_elastic(args):
    """Run this node's elastic workers until the job ends; returns the exit status."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    launch, program, program_args = elastic_plan(args)
    if args.dry_run:
        print(f"elastic launch: {launch}")
        print(" ".join([program] + program_args))
        return 0
    if launch["rdzv_backend"] == MIN_TIME_BACKEND:
        register_backend()
    # torch elastic shares one TCP store across rounds by default, but a node that stays rank 0
    # then never re-announces its address in a later round, so a node joining in that round
    # waits for it forever (scale-up hangs): a fresh store per round avoids that
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    cores = os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // launch["nproc_per_node"])))
    logger.info(f"elastic training: {launch['min_nodes']}..{launch['max_nodes']} node(s) x "
                f"{launch['nproc_per_node']} worker(s), rendezvous {launch['rdzv_endpoint']} "
                f"(run id {launch['run_id']})")
    try:
        elastic_launch(LaunchConfig(**launch), program)(*program_args)
    except ChildFailedError as err:
        failures = ", ".join(f"rank {f.rank} (exit code {f.exitcode})"
                             for f in err.failures.values())
        logger.error(f"elastic job failed after its restarts: {failures}")
        return 1
    return 0


__all__ = ["run_elastic", "elastic_plan"]
