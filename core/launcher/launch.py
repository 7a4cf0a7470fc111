"""Per-node launcher: `python -m deepspeed.launcher.launch --world_info=... script.py args`.

The `deepspeed` runner starts one of these on every node (directly, over pdsh, or by hand with
`--no_ssh`). It works out this node's share of the world from the base64 world info, starts one
worker per local slot with the torch.distributed environment filled in, and watches them: the
first worker to fail takes the others down, so a crashed rank never leaves its peers hanging in a
collective forever.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

from deepspeed.utils import numa as core_binding
from deepspeed.launcher.constants import (KILL_GRACE_SECONDS, LOG_LEVELS, PID_FILE_TEMPLATE,
                                          POLL_INTERVAL_SECONDS, TORCH_DISTRIBUTED_DEFAULT_PORT)
from deepspeed.launcher.hostfile import decode_world_info
from deepspeed.utils.logging import logger


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m deepspeed.launcher.launch",
        description="Start and supervise this node's DeepSpeed workers.")
    parser.add_argument("--node_rank", type=int, default=0,
                        help="Index of this node in the world info, in [0, number of nodes).")
    parser.add_argument("--master_addr", default="127.0.0.1", type=str,
                        help="Address of the rank-0 node, used by torch.distributed rendezvous.")
    parser.add_argument("--master_port", default=TORCH_DISTRIBUTED_DEFAULT_PORT, type=int,
                        help="Free port on the rank-0 node for rendezvous.")
    parser.add_argument("--world_info", required=True, type=str,
                        help="base64-encoded JSON {host: [slot ids]} of the whole world.")
    parser.add_argument("--module", action="store_true",
                        help="Run the script as a module, like 'python -m'.")
    parser.add_argument("--no_python", action="store_true",
                        help="Execute the script directly instead of through python.")
    parser.add_argument("--no_local_rank", action="store_true",
                        help="Do not pass --local_rank=<i> to the workers.")
    parser.add_argument("--save_pid", type=int, default=0,
                        help="Write this launcher's pid to /tmp/<save_pid>.deepspeed.")
    parser.add_argument("--enable_each_rank_log", default=None, type=str,
                        help="Directory that receives one stdout+stderr log file per rank.")
    parser.add_argument("--bind_cores_to_rank", action="store_true",
                        help="Pin each worker to its own share of the CPU cores.")
    parser.add_argument("--bind_core_list", type=str, default=None,
                        help="Cores to share out with --bind_cores_to_rank, e.g. 0-13,28-41.")
    parser.add_argument("--log_level", choices=LOG_LEVELS, default=None,
                        help="Verbosity of this launcher's own messages.")
    parser.add_argument("--dry_run", action="store_true",
                        help="Print each worker's environment and command, start nothing.")
    parser.add_argument("--visible_devices_envs", type=str, default=None,
                        help="Comma-separated variables that restrict a worker to its devices, "
                             "as the runner's accelerator named them on this same node (so this "
                             "process need not import torch); default: ask the accelerator.")
    parser.add_argument("training_script", type=str, help="The program each worker runs.")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.module and args.no_python:
        parser.error("--module and --no_python are mutually exclusive")
    if args.bind_core_list and not args.bind_cores_to_rank:
        parser.error("--bind_core_list needs --bind_cores_to_rank")
    return args


@dataclass
class WorkerSpec:
    """Everything needed to start one worker; `env` holds only what differs from the base env."""
    global_rank: int
    local_rank: int
    cmd: List[str]
    env: Dict[str, str]
    affinity: Optional[List[int]] = None  # applied in the child when numactl is unavailable
    log_path: Optional[str] = None
    cores: Optional[List[int]] = None  # the cores this rank is bound to, for logs


def node_layout(world_info, node_rank):
    """(this node's slots, global rank of its first worker, world size) for `node_rank`."""
    hosts = list(world_info)
    if not 0 <= node_rank < len(hosts):
        raise ValueError(f"--node_rank {node_rank} is outside [0, {len(hosts)}) for hosts {hosts}")
    offset = sum(len(world_info[h]) for h in hosts[:node_rank])
    world_size = sum(len(slots) for slots in world_info.values())
    return list(world_info[hosts[node_rank]]), offset, world_size


def visible_devices_envs(given=None):
    """Names of the env vars that restrict a worker to its device(s): `given` (the runner's
    --visible_devices_envs), else from the accelerator, which costs this process a torch import."""
    if given:
        return [name for name in given.split(",") if name]
    from deepspeed.accelerator import get_accelerator

    return list(get_accelerator().visible_devices_envs())


def _program(args, local_rank):
    if args.no_python:
        program = [args.training_script]
    elif args.module:
        program = [sys.executable, "-u", "-m", args.training_script]
    else:
        program = [sys.executable, "-u", args.training_script]
    if not args.no_local_rank:
        program.append(f"--local_rank={local_rank}")
    return program + list(args.training_script_args)


def _available_core_count():
    return len(core_binding.available_cores())


def build_worker_specs(args, base_env, device_envs, log_prefix=None):
    """One WorkerSpec per local slot of `args.node_rank`; pure apart from reading the CPU topology."""
    world_info = decode_world_info(args.world_info)
    slots, offset, world_size = node_layout(world_info, args.node_rank)
    local_size = len(slots)
    rank_cores = None
    if args.bind_cores_to_rank:
        rank_cores = core_binding.rank_core_assignment(local_size, args.bind_core_list)
    default_threads = str(max(1, _available_core_count() // local_size))
    if log_prefix is None:
        log_prefix = time.strftime("%Y%m%d%H%M%S")

    specs = []
    for local_rank in range(local_size):
        rank = offset + local_rank
        env = {
            "MASTER_ADDR": args.master_addr,
            "MASTER_PORT": str(args.master_port),
            "WORLD_SIZE": str(world_size),
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_SIZE": str(local_size),
            "CROSS_RANK": str(args.node_rank),
            "CROSS_SIZE": str(len(world_info)),
        }
        for name in device_envs:
            env[name] = ",".join(str(s) for s in slots)
        cmd = _program(args, local_rank)
        affinity = None
        cores = None
        if rank_cores is not None:
            cores = rank_cores[local_rank]
            # binding is an explicit request, so its thread count wins over an inherited one
            env["OMP_NUM_THREADS"] = str(len(cores))
            prefix = core_binding.numactl_prefix(cores)
            if prefix is None:
                affinity = cores
            else:
                cmd = prefix + cmd
        elif "OMP_NUM_THREADS" not in base_env:
            env["OMP_NUM_THREADS"] = default_threads
        log_path = None
        if args.enable_each_rank_log:
            log_path = os.path.join(args.enable_each_rank_log, f"{log_prefix}_rank{rank}.log")
        specs.append(WorkerSpec(rank, local_rank, cmd, env, affinity, log_path, cores))
    return specs


def check_master_addr(world_info, master_addr, master_port):
    """Raise ValueError when a multi-node world's --master_addr does not resolve on this node.

    Every rank, rank 0 included, connects to MASTER_ADDR to rendezvous; a name this node cannot
    resolve would otherwise surface only as torch.distributed's error after its timeout.
    """
    if len(world_info) < 2:
        return
    try:
        socket.getaddrinfo(master_addr, master_port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        raise ValueError(
            f"--master_addr {master_addr!r} does not resolve on this node "
            f"({socket.gethostname()}): {err}; every node connects to rank 0's host by this name, "
            f"so use a name or address all nodes can reach (default: the first hostfile host, "
            f"{next(iter(world_info))!r})") from None


def describe_exit(returncode):
    """Human wording of a Popen return code: 'exited with code 3' / 'was killed by signal 9 (SIGKILL)'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-returncode} ({name})"
    return f"exited with code {returncode}"


def shell_exit_code(returncode):
    """Map a Popen return code to a process exit status the way a shell reports it (128 + signal)."""
    return 128 - returncode if returncode < 0 else returncode


def describe_started(procs):
    """One line for the workers this node started (one line per rank would repeat itself N
    times): their global ranks, pids and, when bound, cores."""
    parts = []
    for spec, proc in procs:
        cores = f" on cores {core_binding.format_core_list(spec.cores)}" if spec.cores else ""
        parts.append(f"{spec.global_rank} (pid {proc.pid}{cores})")
    noun = "rank" if len(parts) == 1 else "ranks"
    return f"started {noun} {', '.join(parts)} on this node"


class WorkerGroup:
    """Starts the workers of one node and tears all of them down as soon as one fails."""

    def __init__(self, specs, base_env, grace_seconds=KILL_GRACE_SECONDS):
        self.specs = specs
        self.base_env = base_env
        self.grace_seconds = grace_seconds
        self.procs = []  # (spec, Popen)
        self._log_files = []
        self.received_signal = None

    def start(self):
        for spec in self.specs:
            env = dict(self.base_env)
            env.update(spec.env)
            stdout = stderr = None
            if spec.log_path:
                os.makedirs(os.path.dirname(spec.log_path) or ".", exist_ok=True)
                stdout = open(spec.log_path, "w", encoding="utf-8")  # closed in close()
                stderr = subprocess.STDOUT
                self._log_files.append(stdout)
            preexec = None
            if spec.affinity is not None:
                cores = set(spec.affinity)

                def preexec(cores=cores):
                    os.sched_setaffinity(0, cores)

            try:
                proc = subprocess.Popen(spec.cmd, env=env, stdout=stdout, stderr=stderr,
                                        preexec_fn=preexec)
            except OSError as err:
                self.terminate_all()
                raise RuntimeError(f"could not start rank {spec.global_rank} with command "
                                   f"{spec.cmd}: {err}") from err
            self.procs.append((spec, proc))
        logger.info(describe_started(self.procs))

    def forward_signal(self, signum, _frame=None):
        """Signal handler: pass SIGINT/SIGTERM on to every worker still running."""
        self.received_signal = signum
        for _spec, proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    continue

    def wait(self):
        """Block until all workers finish; returns this node's exit status."""
        pending = list(self.procs)
        while pending:
            if self.received_signal is not None:
                logger.warning(f"received {signal.Signals(self.received_signal).name}; "
                               f"stopping {len(pending)} worker(s)")
                self.terminate_all(first_signal=None)
                return 128 + self.received_signal
            still_running, failed = [], []
            for spec, proc in pending:
                code = proc.poll()
                if code is None:
                    still_running.append((spec, proc))
                elif code != 0:
                    failed.append((spec, proc))
            if failed:
                for spec, proc in failed:
                    logger.error(f"rank {spec.global_rank} (local rank {spec.local_rank}, pid "
                                 f"{proc.pid}) {describe_exit(proc.returncode)}; command: "
                                 f"{' '.join(spec.cmd)}")
                if still_running:
                    ranks = ", ".join(str(s.global_rank) for s, _ in still_running)
                    logger.error(f"terminating the remaining worker(s): rank(s) {ranks}")
                self.terminate_all()
                return shell_exit_code(failed[0][1].returncode)
            pending = still_running
            if pending:
                time.sleep(POLL_INTERVAL_SECONDS)
        return 0

    def terminate_all(self, first_signal=signal.SIGTERM):
        """SIGTERM every live worker and its children, SIGKILL whatever outlives the grace period."""
        import psutil

        victims = []
        for _spec, proc in self.procs:
            if proc.poll() is not None:
                continue
            try:
                parent = psutil.Process(proc.pid)
                victims.extend(parent.children(recursive=True))
                victims.append(parent)
            except psutil.NoSuchProcess:
                continue
        if first_signal is not None:
            for victim in victims:
                try:
                    victim.send_signal(first_signal)
                except psutil.NoSuchProcess:
                    continue
        _gone, alive = psutil.wait_procs(victims, timeout=self.grace_seconds)
        for victim in alive:
            try:
                victim.kill()
            except psutil.NoSuchProcess:
                continue
        psutil.wait_procs(alive, timeout=self.grace_seconds)
        for _spec, proc in self.procs:
            proc.poll()

    def close(self):
        for handle in self._log_files:
            handle.close()
        self._log_files = []


def format_spec(spec):
    """One shell-like line per worker, used by --dry_run."""
    import shlex

    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env.items())
    extra = f" # affinity {core_binding.format_core_list(spec.affinity)}" if spec.affinity else ""
    log = f" > {shlex.quote(spec.log_path)} 2>&1" if spec.log_path else ""
    return f"{env} {shlex.join(spec.cmd)}{log}{extra}"


def main(argv=None):
    args = parse_args(argv)
    if args.log_level:
        logger.setLevel(args.log_level.upper())
    base_env = dict(os.environ)
    try:
        specs = build_worker_specs(args, base_env, visible_devices_envs(args.visible_devices_envs))
        check_master_addr(decode_world_info(args.world_info), args.master_addr, args.master_port)
    except ValueError as err:
        print(f"deepspeed.launcher.launch: error: {err}", file=sys.stderr)
        return 1
    if args.dry_run:
        for spec in specs:
            print(format_spec(spec))
        return 0

    pid_file = None
    if args.save_pid:
        pid_file = PID_FILE_TEMPLATE.format(pid=args.save_pid)
        with open(pid_file, "w", encoding="ascii") as handle:
            handle.write(str(os.getpid()))

    group = WorkerGroup(specs, base_env)
    previous = {sig: signal.signal(sig, group.forward_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        group.start()
        return group.wait()
    except RuntimeError as err:
        logger.error(str(err))
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        group.close()
        if pid_file and os.path.exists(pid_file):
            os.remove(pid_file)


if __name__ == "__main__":
    sys.exit(main())
