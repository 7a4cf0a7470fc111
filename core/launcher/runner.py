"""The `deepspeed` / `ds` command: decide where workers run, then start the right launcher.

Steps: parse the flags, build the resource pool (hostfile, else this machine's accelerator),
apply `--include`/`--exclude`/`--num_nodes`/`--num_gpus`, then either run the per-node launcher
(`deepspeed.launcher.launch`) here for a single node or for `--no_ssh`, or build the multi-node
command (pdsh, MPI, SLURM) and run it. `--dry_run` prints the command(s) instead of running them.
The exit status is the launcher's, so a failed rank fails the `deepspeed` command.
"""
import argparse
import difflib
import importlib.machinery
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections import OrderedDict

from deepspeed.launcher import constants as C
from deepspeed.utils.numa import parse_core_list
from deepspeed.launcher.environment import exports_for_remote, load_deepspeed_env
from deepspeed.launcher.flag_prefixes import FlagRecordingParser, expand_flag_prefixes
from deepspeed.launcher.hostfile import encode_world_info, fetch_hostfile, parse_inclusion_exclusion
# upstream's runner has it: launch scripts filter their own {host: slots} tables with it
from deepspeed.launcher.hostfile import parse_resource_filter  # noqa: F401
from deepspeed.launcher.launch import shell_exit_code
from deepspeed.launcher.multinode_runner import RUNNERS, launch_passthrough_flags
from deepspeed.launcher.plugin_commands import (add_plugin_arguments, check_one_plugin_command,
                                                given_plugin_flags, missing_plugin_flag,
                                                missing_plugin_problem, run_plugin_command)
from deepspeed.utils.logging import logger
from deepspeed.utils.progress import progress

# accelerate (`accelerate launch` with DeepSpeed) imports this name from here, as upstream's runner has it
DEEPSPEED_ENVIRONMENT_NAME = C.DEEPSPEED_ENVIRONMENT_NAME


class LauncherError(RuntimeError):
    """The launch cannot proceed on this machine (missing tool, unreachable host, no devices)."""


class RunnerArgumentParser(FlagRecordingParser):
    """argparse that answers an unknown flag with the closest known one (``--num_gpu`` ->
    ``--num_gpus``): argparse's own abbreviations are off (unambiguous prefixes are expanded by
    ``flag_prefixes`` before the user script only), so a near miss would otherwise only be
    "unrecognized"."""

    def error(self, message):
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            tokens = message[len(prefix):].split()
            message = prefix + " ".join(self._with_hint(token) for token in tokens)
        super().error(message)

    def close_flag(self, token):
        """The known flag an unknown ``--flag`` (or ``--flag=value``) most likely meant."""
        if not token.startswith("-"):
            return None
        known = [flag for flag in self._option_string_actions if flag.startswith("--")]
        guess = difflib.get_close_matches(token.split("=", 1)[0], known, n=1, cutoff=0.75)
        return guess[0] if guess else None

    def _with_hint(self, token):
        guess = self.close_flag(token)
        return f"{token} (did you mean {guess}?)" if guess else token


def build_parser():
    # unambiguous prefixes of these flags are accepted before the user script only
    # (deepspeed.launcher.flag_prefixes: argparse's own matching would read the script's flags)
    parser = RunnerArgumentParser(
        prog="deepspeed",
        description="DeepSpeed runner: starts a distributed training job on one or more nodes.")
    parser.add_argument("-H", "--hostfile", type=str, default=None,
                        help=f"Hostfile of '<hostname> slots=<N>' lines (default {C.DLTS_HOSTFILE}, "
                             f"used only if it exists; without one, local devices are used).")
    parser.add_argument("-i", "--include", type=str, default="",
                        help="Only use these hosts/slots: NAME[:SLOT[,SLOT...]][@NAME...], "
                             "e.g. 'worker-0@worker-1:0,2' or 'localhost:1'.")
    parser.add_argument("-e", "--exclude", type=str, default="",
                        help="Do not use these hosts/slots (same syntax as --include).")
    parser.add_argument("--num_nodes", type=int, default=-1,
                        help="Use the first N hosts of the hostfile (default: all).")
    parser.add_argument("--num_gpus", "--num_accelerators", dest="num_gpus", type=int, default=-1,
                        help="Workers per node (default: all local accelerators; on CPU, one per "
                             "NUMA node).")
    parser.add_argument("--master_port", type=int, default=C.TORCH_DISTRIBUTED_DEFAULT_PORT,
                        help="Free port on the rank-0 node for torch.distributed rendezvous.")
    parser.add_argument("--master_addr", type=str, default="",
                        help="Address of the rank-0 node (default: 127.0.0.1 on one node, else "
                             "the first host).")
    parser.add_argument("--node_rank", type=int, default=-1,
                        help="With --no_ssh: this node's index in the hostfile, in [0, N).")
    parser.add_argument("--launcher", type=str.lower, default=None, choices=C.LAUNCHERS,
                        help="Multi-node launcher (default pdsh).")
    parser.add_argument("--launcher_args", type=str, default="",
                        help="Extra arguments for the multi-node launcher, as one quoted string.")
    parser.add_argument("--module", action="store_true",
                        help="Run the user script as a module, like 'python -m'.")
    parser.add_argument("--no_python", action="store_true",
                        help="Execute the user script directly instead of through python.")
    parser.add_argument("--no_local_rank", action="store_true",
                        help="Do not pass --local_rank=<i> to the user script.")
    parser.add_argument("--no_ssh", action="store_true",
                        help="Start only this node's workers (run the same command on every node "
                             "with its --node_rank), like torchrun.")
    parser.add_argument("--no_ssh_check", action="store_true",
                        help="Skip the passwordless-ssh check of multi-node launches.")
    parser.add_argument("--force_multi", action="store_true",
                        help="Use the multi-node launcher even for a single host.")
    parser.add_argument("--save_pid", action="store_true",
                        help="Write the launcher's pid to "
                             f"{C.PID_FILE_TEMPLATE.format(pid='<deepspeed pid>')}.")
    parser.add_argument("--enable_each_rank_log", type=str, default=None, metavar="DIR",
                        help="Send each rank's stdout/stderr to DIR/<timestamp>_rank<R>.log.")
    parser.add_argument("--bind_cores_to_rank", action="store_true",
                        help="Pin each rank to its own share of the CPU cores (numactl if installed) "
                             "and set OMP_NUM_THREADS to that share.")
    parser.add_argument("--bind_core_list", type=str, default=None,
                        help="Cores to share out with --bind_cores_to_rank, e.g. 0-13,28-41.")
    parser.add_argument("--ssh_port", type=int, default=None, help="ssh port of the remote hosts.")
    parser.add_argument("--venv_script", type=str, default=None,
                        help="Script sourced on every remote node before starting the launcher.")
    parser.add_argument("--log_level", type=str.lower, default=None, choices=C.LOG_LEVELS,
                        help="Verbosity of the launcher's own messages (default info).")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="Only print the launcher's warnings and errors.")
    parser.add_argument("--dry_run", action="store_true",
                        help="Print the exact command(s) that would run and exit.")
    parser.add_argument("user_script", type=str, help="The training program and its arguments.")
    parser.add_argument("user_args", nargs=argparse.REMAINDER)
    return parser


def parse_args(argv=None):
    """The parsed command line; ``args.plugin_flags`` lists the argparse actions of the flags
    installed plugins added (``deepspeed_launcher_arguments``) that it sets."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    actions = add_plugin_arguments(parser)
    try:
        argv = expand_flag_prefixes(argv, parser.flag_actions)
    except ValueError as err:
        parser.error(str(err))
    missing = missing_plugin_flag(argv, actions)
    if missing is not None:
        raise LauncherError(missing_plugin_problem(missing))
    args = parser.parse_args(argv)
    args.command_line = argv  # flags written out in full, for a plugin's command
    args.plugin_flags = given_plugin_flags(args, actions)
    check_one_plugin_command(args.plugin_flags, actions)
    return args


def validate_args(args):
    """Reject flag combinations that have no meaning, before any resource is looked at."""
    if args.include and args.exclude:
        raise ValueError("--include and --exclude are mutually exclusive")
    if (args.num_nodes > 0 or args.num_gpus > 0) and (args.include or args.exclude):
        raise ValueError("Cannot specify num_nodes/gpus with include/exclude: --include/--exclude "
                         "choose the hosts and slots themselves")
    for flag, value in (("--num_nodes", args.num_nodes), ("--num_gpus", args.num_gpus)):
        if value == 0 or value < -1:
            raise ValueError(f"{flag} must be a positive integer (or -1 for all), got {value}")
    if not 0 < args.master_port < 65536:
        raise ValueError(f"--master_port must be in 1..65535, got {args.master_port}")
    if args.module and args.no_python:
        raise ValueError("--module and --no_python are mutually exclusive")
    if args.bind_core_list is not None:
        if not args.bind_cores_to_rank:
            raise ValueError("--bind_core_list needs --bind_cores_to_rank")
        parse_core_list(args.bind_core_list)
    if args.node_rank >= 0 and not args.no_ssh:
        raise ValueError("--node_rank is only meaningful with --no_ssh")
    if args.no_ssh and args.force_multi:
        raise ValueError("--no_ssh and --force_multi are mutually exclusive: --no_ssh starts only "
                         "this node's workers, --force_multi starts every node's")
    if args.no_ssh and args.launcher not in (None, C.PDSH_LAUNCHER):
        raise ValueError(f"--no_ssh runs the per-node launcher directly; --launcher {args.launcher} "
                         f"cannot be combined with it")


def _script_candidates(script):
    """Files next to where ``script`` should be whose names are close to its name."""
    directory = os.path.dirname(script) or "."
    try:
        names = [n for n in os.listdir(directory) if os.path.isfile(os.path.join(directory, n))]
    except OSError:
        return []
    close = difflib.get_close_matches(os.path.basename(script), names, n=3, cutoff=0.6)
    return [os.path.join(os.path.dirname(script), n) for n in close]


def missing_script_problem(args):
    """Why the user script cannot start on this machine, or None: checked once here instead of
    letting every rank fail on it. ``--module`` names a module to find, ``--no_python`` a
    program (a path or a name on PATH), otherwise a Python file."""
    script = args.user_script
    if args.module:
        # ``python -m`` in the ranks searches their cwd (this one) first; only the top-level
        # package is looked up, so nothing of the user's is imported here
        top = script.split(".", 1)[0]
        found = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()] + sys.path)
        if found is None:
            return (f"--module: no module named '{script}' can be imported from "
                    f"{os.getcwd()} (python -m {script} would fail)")
        return None
    if args.no_python and shutil.which(script) is not None:
        return None
    if os.path.isfile(script):
        return None
    where = os.path.abspath(script)
    if os.path.isdir(script):
        return f"the user script '{script}' is a directory ({where}), not a file"
    guesses = _script_candidates(script)
    hint = f"; did you mean {' or '.join(repr(g) for g in guesses)}?" if guesses else ""
    kind = "program" if args.no_python else "script"
    return f"the user {kind} '{script}' does not exist ({where}){hint}"


def check_user_script(args, remote=False):
    """Stop before any rank starts when the script is missing here. A dry run only warns (it
    starts nothing), and so does a launch whose ranks all run on other hosts, which may see
    another file system."""
    problem = missing_script_problem(args)
    if problem is None:
        return
    if args.dry_run:
        logger.warning(f"{problem}: a real run would stop here")
    elif remote:
        logger.warning(f"{problem} on this machine; the ranks on the other hosts will need it")
    else:
        raise LauncherError(f"{problem} (no rank was started)")


def _accelerator():
    from deepspeed.accelerator import get_accelerator

    return get_accelerator()


def honour_visible_devices(args, env):
    """Map a preset CUDA_VISIBLE_DEVICES (or the accelerator's equivalent) onto --include.

    The per-node launcher sets the visible-devices variable for every worker, so an inherited
    value would otherwise be silently overwritten. Without filter flags it becomes
    `--include localhost:<list>`; with them it is ignored, and either way the user is told.
    """
    names = []
    for name in list(_accelerator().visible_devices_envs()) + ["CUDA_VISIBLE_DEVICES"]:
        if name not in names:
            names.append(name)
    for name in names:
        value = env.get(name, "")
        if not value:
            continue
        slots = [s.strip() for s in value.split(",")]
        if not all(s.isdigit() for s in slots):
            logger.warning(f"Detected {name}={value}, which is not a list of device indices; "
                           f"leaving it to the workers. Use --include to choose devices.")
            return
        if args.include or args.exclude or args.num_nodes > 0 or args.num_gpus > 0:
            logger.info(f"Detected {name}={value} but ignoring it because one or several of "
                        f"--include/--exclude/--num_gpus/--num_nodes were given")
        else:
            args.include = "localhost:" + ",".join(slots)
            logger.info(f"Detected {name}={value}: setting --include={args.include}")
        for other in names:
            env.pop(other, None)
            os.environ.pop(other, None)
        return


def _runs_on_host_cpu(accel):
    """True for the CPU accelerator and any extension of it: workers are CPU processes, so
    their number is not limited by a device count (checked by device type, not by name)."""
    return accel.device_name() == "cpu"


def local_resource_pool():
    """(pool, default workers or None) for this machine when there is no hostfile.

    On CPU every core may host a worker, but the default is one worker per NUMA node (what the
    CPU accelerator reports as its device count), as oversubscribing cores only slows training.
    """
    accel = _accelerator()
    if _runs_on_host_cpu(accel):
        return OrderedDict(localhost=os.cpu_count() or 1), max(1, int(accel.device_count()))
    count = int(accel.device_count())
    if count < 1:
        raise LauncherError(f"Unable to proceed, no GPU resources available (accelerator "
                            f"'{accel.name}' reports {count} devices)")
    return OrderedDict(localhost=count), None


def oversubscription_warning(host, ranks, cores):
    """What happens when more CPU ranks than cores are asked for: they start anyway (a valid
    way to test many ranks on one machine), sharing the cores."""
    threads = max(1, cores // ranks)
    return (f"--num_gpus {ranks} asks for {ranks} CPU ranks but host '{host}' has {cores} "
            f"core(s): starting {ranks} ranks anyway, {threads} thread(s) each (OMP_NUM_THREADS), "
            f"about {ranks / cores:.3g} ranks per core, so each step will be slower than with "
            f"--num_gpus {cores} or fewer")


def select_resources(args, pool, local_default=None, pool_is_cpu=None):
    """Filter `pool` into the `{host: [slots]}` that will run workers.

    `local_default` is the CPU default worker count of a detected local pool; `pool_is_cpu`
    says whether --num_gpus may exceed the slots (CPU processes, not devices).
    """
    active = parse_inclusion_exclusion(pool, args.include, args.exclude)
    if args.num_nodes > 0:
        if args.num_nodes > len(active):
            raise ValueError(f"--num_nodes {args.num_nodes} but only {len(active)} host(s) "
                             f"available: {', '.join(active)}")
        active = OrderedDict(list(active.items())[:args.num_nodes])
    if args.num_gpus > 0:
        for host, slots in list(active.items()):
            if args.num_gpus <= len(slots):
                active[host] = slots[:args.num_gpus]
                continue
            if pool_is_cpu is None:
                pool_is_cpu = _runs_on_host_cpu(_accelerator())
            if not pool_is_cpu:
                raise ValueError(f"--num_gpus {args.num_gpus} but host '{host}' has only "
                                 f"{len(slots)} slot(s)")
            logger.warning(oversubscription_warning(host, args.num_gpus, len(slots)))
            active[host] = list(range(args.num_gpus))
    elif local_default is not None and not (args.include or args.exclude):
        active = OrderedDict((host, slots[:local_default]) for host, slots in active.items())
    return active


def local_launch_cmd(args, world_info, node_rank):
    cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world_info}",
           f"--node_rank={node_rank}", f"--master_addr={args.master_addr}",
           f"--master_port={args.master_port}"]
    cmd += launch_passthrough_flags(args)
    if args.save_pid:
        cmd.append(f"--save_pid={os.getpid()}")
    if getattr(args, "visible_devices_envs", None):
        cmd.append(f"--visible_devices_envs={','.join(args.visible_devices_envs)}")
    return cmd + [args.user_script] + list(args.user_args)


def check_ssh(hosts, ssh_port):
    """Passwordless ssh to every host, one at a time (up to 10 s each on an unreachable one: a
    progress bar over the hosts on a terminal)."""
    for host in progress(hosts, desc="checking ssh to the hosts", unit="host", leave=False):
        cmd = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
        if ssh_port is not None:
            cmd += ["-p", str(ssh_port)]
        result = subprocess.run(cmd + [host, "true"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, check=False)
        if result.returncode != 0:
            raise LauncherError(
                f"host '{host}' is not reachable over passwordless ssh ({result.stderr.strip()}); "
                f"set up ssh keys, pass --no_ssh_check, or remove the hostfile for a "
                f"single-node run")


def run_command(cmd, env, pid_file=None):
    """Run the launcher command, forwarding SIGINT/SIGTERM to it; returns the exit status."""
    proc = subprocess.Popen(cmd, env=env)
    if pid_file:
        with open(pid_file, "w", encoding="ascii") as handle:
            handle.write(str(proc.pid))

    def forward(signum, _frame):
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        returncode = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pid_file and os.path.exists(pid_file):
            os.remove(pid_file)
    return shell_exit_code(returncode)


def _print_dry_run(cmd, env_updates, worker_lines):
    for key, value in env_updates.items():
        print(f"export {key}={shlex.quote(value)}")
    print(shlex.join(cmd))
    for line in worker_lines:
        print(f"#   {line}")


def resolve_resources(args, env):
    """(pool, active resources) from the hostfile, else from this machine's accelerator."""
    if args.hostfile is not None and not os.path.isfile(args.hostfile):
        raise ValueError(f"hostfile {args.hostfile!r} does not exist")
    args.hostfile_path = args.hostfile or (C.DLTS_HOSTFILE if os.path.isfile(C.DLTS_HOSTFILE) else None)
    pool = fetch_hostfile(args.hostfile_path)
    local_default, pool_is_cpu = None, None
    if pool is None:
        honour_visible_devices(args, env)
        if args.num_nodes > 1:
            raise ValueError(f"Num nodes is >1 but no extra nodes available via hostfile "
                             f"(no hostfile at {args.hostfile or C.DLTS_HOSTFILE})")
        pool, local_default = local_resource_pool()
        pool_is_cpu = local_default is not None
        # the per-node launcher will run on this node under this accelerator: tell it the names,
        # so that it does not import torch to ask again
        args.visible_devices_envs = list(_accelerator().visible_devices_envs())
    return pool, select_resources(args, pool, local_default, pool_is_cpu)


def _run_here(args, env, deepspeed_env, active, world_info, launcher_given):
    """Single node or --no_ssh: run the per-node launcher on this machine."""
    if args.no_ssh:
        node_rank = 0 if args.node_rank < 0 and len(active) == 1 else args.node_rank
        if not 0 <= node_rank < len(active):
            raise ValueError(f"--no_ssh needs --node_rank in [0, {len(active)}) for hosts "
                             f"{', '.join(active)}, got {args.node_rank}")
    else:
        node_rank = 0
        for flag, given in (("--launcher", launcher_given), ("--launcher_args", args.launcher_args),
                            ("--venv_script", args.venv_script), ("--ssh_port", args.ssh_port)):
            if given:
                logger.warning(f"{flag} only applies to multi-node launches; ignoring it")
    check_user_script(args)  # this node's ranks run it
    cmd = local_launch_cmd(args, world_info, node_rank)
    if args.dry_run:
        from deepspeed.launcher import launch

        launch_args = launch.parse_args(cmd[cmd.index("deepspeed.launcher.launch") + 1:])
        specs = launch.build_worker_specs(launch_args, env,
                                          launch.visible_devices_envs(launch_args.visible_devices_envs))
        _print_dry_run(cmd, deepspeed_env, [launch.format_spec(s) for s in specs])
        return 0
    return run_command(cmd, env)


def _run_multi_node(args, env, deepspeed_env, pool, active, world_info):
    """Several hosts: build and run the chosen multi-node launcher's command."""
    runner = RUNNERS[args.launcher](args, world_info, active, pool,
                                    exports_for_remote(env, deepspeed_env, os.path.abspath(".")),
                                    _accelerator().visible_devices_envs())
    runner.validate()
    check_user_script(args, remote=True)
    cmd = runner.get_cmd()
    run_env = runner.get_env(env)
    if args.dry_run:
        _print_dry_run(cmd, {k: v for k, v in run_env.items() if env.get(k) != v}, [])
        return 0
    missing = runner.missing_binaries()
    if missing:
        raise LauncherError(f"launcher '{args.launcher}' not installed: {', '.join(missing)} not "
                            f"found on PATH")
    if not args.no_ssh_check and args.launcher != C.SLURM_LAUNCHER:
        if shutil.which("ssh") is None:
            raise LauncherError("ssh not found on PATH; it is needed to reach the other hosts "
                                "(pass --no_ssh_check to skip this check)")
        check_ssh(list(active), args.ssh_port)
    runner.prepare()
    logger.info(f"cmd = {shlex.join(cmd)}")
    pid_file = C.PID_FILE_TEMPLATE.format(pid=os.getpid()) if args.save_pid else None
    return run_command(cmd, run_env, pid_file)


def _main(argv=None):
    args = parse_args(argv)
    launcher_given = args.launcher is not None
    args.launcher = args.launcher or C.PDSH_LAUNCHER
    if args.quiet and not args.log_level:
        args.log_level = "warning"  # also quietens the per-node launchers it starts
    if args.log_level:
        logger.setLevel(args.log_level.upper())
    validate_args(args)
    if args.enable_each_rank_log:
        args.enable_each_rank_log = os.path.abspath(args.enable_each_rank_log)
    if args.plugin_flags:  # the plugin checks its flags, then the script (check_user_script)
        return run_plugin_command(args, args.command_line, args.plugin_flags,
                                  error_type=LauncherError)

    env = dict(os.environ)
    pool, active = resolve_resources(args, env)
    world_info = encode_world_info(active)
    multi_node = args.force_multi or len(active) > 1
    if not args.master_addr:
        # one host: everything is local; several: the first host runs rank 0
        args.master_addr = next(iter(active)) if multi_node else "127.0.0.1"
    deepspeed_env = load_deepspeed_env(env)
    env.update(deepspeed_env)
    logger.info(f"World info: {dict(active)} (world size {sum(len(s) for s in active.values())})")

    if args.no_ssh or not multi_node:
        return _run_here(args, env, deepspeed_env, active, world_info, launcher_given)
    return _run_multi_node(args, env, deepspeed_env, pool, active, world_info)


def main(argv=None):
    """Console entry point: returns the exit status; bad input is one clear line, not a traceback."""
    try:
        return _main(argv)
    except (ValueError, LauncherError) as err:
        print(f"deepspeed: error: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
