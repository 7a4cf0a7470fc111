"""Command builders for multi-node launches: pdsh, OpenMPI, MPICH, Intel MPI, SLURM, MVAPICH.

Each builder turns the filtered resources into the one command the `deepspeed` runner executes on
this machine, plus the local environment that command needs. Building is pure (so `--dry_run` and
tests can show the exact command without any of these tools installed); `prepare()` writes the
auxiliary files a launcher reads (only mvapich needs one) and is called only for a real launch.

pdsh runs our per-node launcher (`deepspeed.launcher.launch`) on every host, so all launcher
features work. The MPI-style launchers start the workers themselves: each worker learns its rank
from the MPI launcher's own variables (OMPI_COMM_WORLD_*, PMI_*, MV2_COMM_WORLD_*, SLURM_*), which
`deepspeed.comm` translates, and receives MASTER_ADDR/MASTER_PORT/WORLD_SIZE from here. Each such
worker runs behind `deepspeed.launcher.rank_guard`, so a rank that dies is named by rank (MPI
launchers name only a pid and host); srun gets --kill-on-bad-exit=1 so that death ends the step.
"""
import os
import shlex
import shutil
import sys

from deepspeed.launcher import constants as C
from deepspeed.utils.numa import format_core_list, parse_core_list, split_cores


class MultiNodeRunner:
    """Base of every builder; `name` is the `--launcher` value and `binaries` must be on PATH."""

    name = None
    binaries = ()
    # launch flags this launcher cannot honour (attribute name on the runner args -> flag)
    unsupported = {}
    # the launcher starts the workers itself (MPI, srun): wrap each in rank_guard, which names
    # the rank when it dies; pdsh starts the per-node launcher, which does that already
    guard_ranks = True

    def __init__(self, args, world_info_base64, active_resources, resource_pool, exports,
                 device_envs):
        self.args = args
        self.world_info_base64 = world_info_base64
        self.resources = active_resources
        self.resource_pool = resource_pool
        self.exports = dict(exports)
        self.device_envs = list(device_envs)
        self.launcher_args = shlex.split(args.launcher_args or "")

    # ---- checks -----------------------------------------------------------------------------
    def missing_binaries(self):
        return [b for b in self.binaries if shutil.which(b) is None]

    def validate(self):
        """Raise ValueError for launch flags this launcher cannot honour."""
        for attr, flag in self.unsupported.items():
            if getattr(self.args, attr, None):
                raise ValueError(f"{flag} is not supported with --launcher {self.name}; use "
                                 f"--launcher pdsh (or --no_ssh) for it")

    # ---- helpers ----------------------------------------------------------------------------
    @property
    def hosts(self):
        return list(self.resources)

    @property
    def world_size(self):
        return sum(len(slots) for slots in self.resources.values())

    def uniform_slots(self):
        """The slot list every host shares; MPI launchers give one environment to all hosts."""
        slot_lists = {host: tuple(slots) for host, slots in self.resources.items()}
        if len(set(slot_lists.values())) != 1:
            raise ValueError(
                f"--launcher {self.name} needs the same slots on every host, got "
                f"{ {h: list(s) for h, s in slot_lists.items()} }; use --launcher pdsh or impi")
        return list(next(iter(slot_lists.values())))

    def program(self, local_rank=None):
        """The worker's command: `python -u [-m] script args`, behind rank_guard when the launcher
        starts workers itself, optionally inside --venv_script."""
        args = self.args
        if args.no_python:
            cmd = [args.user_script]
        elif args.module:
            cmd = [sys.executable, "-u", "-m", args.user_script]
        else:
            cmd = [sys.executable, "-u", args.user_script]
        if local_rank is not None and not args.no_local_rank:
            cmd.append(f"--local_rank={local_rank}")
        cmd += list(args.user_args)
        if self.guard_ranks:
            cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.rank_guard", "--"] + cmd
        if args.venv_script:
            cmd = ["bash", "-c", f". {shlex.quote(args.venv_script)} && exec {shlex.join(cmd)}"]
        return cmd

    def worker_exports(self):
        """Variables every worker needs from an MPI-style launcher, beyond the user's exports."""
        exports = dict(self.exports)
        exports["MASTER_ADDR"] = self.args.master_addr
        exports["MASTER_PORT"] = str(self.args.master_port)
        exports["WORLD_SIZE"] = str(self.world_size)
        slots = ",".join(str(s) for s in self.uniform_slots())
        for name in self.device_envs:
            exports[name] = slots
        return exports

    def get_env(self, base_env):
        """Environment for the launcher binary itself, run on this machine."""
        return dict(base_env)

    def get_cmd(self):
        raise NotImplementedError(f"{type(self).__name__} must build its command")

    def prepare(self):
        """Write any file the launcher reads; only called for a real launch."""


class PDSHRunner(MultiNodeRunner):
    name = C.PDSH_LAUNCHER
    binaries = ("pdsh",)
    guard_ranks = False

    def get_env(self, base_env):
        env = dict(base_env)
        env["PDSH_RCMD_TYPE"] = "ssh"
        if self.args.ssh_port is not None:
            append = env.get("PDSH_SSH_ARGS_APPEND", "")
            env["PDSH_SSH_ARGS_APPEND"] = f"{append} -p {self.args.ssh_port}".strip()
        return env

    def launch_cmd(self):
        """The per-node launcher command; pdsh replaces %n with each host's index in -w."""
        args = self.args
        cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.launch",
               f"--world_info={self.world_info_base64}", "--node_rank=%n",
               f"--master_addr={args.master_addr}", f"--master_port={args.master_port}"]
        cmd += launch_passthrough_flags(args)
        return cmd + [args.user_script] + list(args.user_args)

    def get_cmd(self):
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in self.exports.items())
        venv = f". {shlex.quote(self.args.venv_script)}; " if self.args.venv_script else ""
        remote = f"{exports}{venv}cd {shlex.quote(os.path.abspath('.'))}; {shlex.join(self.launch_cmd())}"
        return (["pdsh", "-S", "-f", str(C.PDSH_MAX_FAN_OUT), "-w", ",".join(self.hosts)]
                + self.launcher_args + [remote])


class OpenMPIRunner(MultiNodeRunner):
    name = C.OPENMPI_LAUNCHER
    binaries = ("mpirun", "ompi_info")
    unsupported = {"bind_cores_to_rank": "--bind_cores_to_rank",
                   "enable_each_rank_log": "--enable_each_rank_log"}

    def validate(self):
        super().validate()
        full = {host: list(range(count)) for host, count in self.resource_pool.items()}
        if dict(self.resources) != full:
            raise ValueError("--launcher openmpi runs every slot of the hostfile; it does not "
                             "support --include/--exclude/--num_nodes/--num_gpus")
        if not self.args.hostfile_path:
            raise ValueError("--launcher openmpi needs a hostfile (-H/--hostfile)")

    def get_cmd(self):
        cmd = ["mpirun", "-n", str(self.world_size), "-hostfile", self.args.hostfile_path,
               "--mca", "btl", "^openib"]
        if self.args.ssh_port is not None:
            cmd += ["--mca", "plm_rsh_args", f"-p {self.args.ssh_port}"]
        cmd += self.launcher_args
        for key, value in self.worker_exports().items():
            cmd += ["-x", f"{key}={value}"]
        return cmd + self.program()


class MPICHRunner(MultiNodeRunner):
    name = C.MPICH_LAUNCHER
    binaries = ("mpirun",)
    unsupported = {"bind_cores_to_rank": "--bind_cores_to_rank",
                   "enable_each_rank_log": "--enable_each_rank_log",
                   "ssh_port": "--ssh_port"}

    def get_cmd(self):
        ppn = len(self.uniform_slots())
        cmd = ["mpirun", "-n", str(self.world_size), "-ppn", str(ppn), "-hosts", ",".join(self.hosts)]
        for key, value in self.worker_exports().items():
            cmd += ["-genv", key, value]
        return cmd + self.launcher_args + self.program()


class IMPIRunner(MultiNodeRunner):
    """Intel MPI, in MPMD form: one `-n 1 -host H -env ...` block per rank, joined by ':'.

    Spelling out every rank lets each one get its RANK/LOCAL_RANK, `--local_rank` argument, own
    device list and, with --bind_cores_to_rank, its own `numactl -C` core share.
    """

    name = C.IMPI_LAUNCHER
    binaries = ("mpirun",)
    unsupported = {"enable_each_rank_log": "--enable_each_rank_log", "ssh_port": "--ssh_port"}

    def rank_cores(self, local_size):
        if self.args.bind_core_list:
            cores = parse_core_list(self.args.bind_core_list)
        else:
            # nodes are assumed alike: this machine's core count stands for every host's
            cores = list(range(os.cpu_count() or 1))
        return split_cores(cores, local_size)

    def get_cmd(self):
        args = self.args
        common = dict(self.exports)
        common.update({"MASTER_ADDR": args.master_addr, "MASTER_PORT": str(args.master_port),
                       "WORLD_SIZE": str(self.world_size), "CROSS_SIZE": str(len(self.hosts))})
        cmd = ["mpirun"]
        for key, value in common.items():
            cmd += ["-genv", key, value]
        cmd += self.launcher_args
        rank = 0
        for node_rank, (host, slots) in enumerate(self.resources.items()):
            bound = self.rank_cores(len(slots)) if args.bind_cores_to_rank else None
            for local_rank in range(len(slots)):
                env = {"RANK": str(rank), "LOCAL_RANK": str(local_rank),
                       "LOCAL_SIZE": str(len(slots)), "CROSS_RANK": str(node_rank)}
                for name in self.device_envs:
                    env[name] = ",".join(str(s) for s in slots)
                program = self.program(local_rank)
                if bound is not None:
                    env["OMP_NUM_THREADS"] = str(len(bound[local_rank]))
                    program = ["numactl", "-C", format_core_list(bound[local_rank])] + program
                if rank:
                    cmd.append(":")
                cmd += ["-n", "1", "-host", host]
                for key, value in env.items():
                    cmd += ["-env", key, value]
                cmd += program
                rank += 1
        return cmd


class SlurmRunner(MultiNodeRunner):
    name = C.SLURM_LAUNCHER
    binaries = ("srun",)
    unsupported = {"bind_cores_to_rank": "--bind_cores_to_rank",
                   "enable_each_rank_log": "--enable_each_rank_log",
                   "ssh_port": "--ssh_port"}

    def get_env(self, base_env):
        # srun hands its own environment to every task; values may contain ',' which
        # `--export=VAR=value` lists could not carry
        env = dict(base_env)
        env.update(self.worker_exports())
        return env

    def get_cmd(self):
        ppn = len(self.uniform_slots())
        # --kill-on-bad-exit: a rank that fails ends the step on every node, as the per-node
        # launcher does under pdsh; srun's default would wait for the others to finish or hang
        cmd = ["srun", "-n", str(self.world_size), "--nodes", str(len(self.hosts)),
               "--ntasks-per-node", str(ppn), "--nodelist", ",".join(self.hosts), "--export=ALL",
               "--kill-on-bad-exit=1"]
        return cmd + self.launcher_args + self.program()


class MVAPICHRunner(MultiNodeRunner):
    name = C.MVAPICH_LAUNCHER
    binaries = ("mpirun_rsh",)
    unsupported = {"bind_cores_to_rank": "--bind_cores_to_rank",
                   "enable_each_rank_log": "--enable_each_rank_log",
                   "ssh_port": "--ssh_port"}
    hostfile_path = C.MVAPICH_TMP_HOSTFILE

    def worker_exports(self):
        exports = super().worker_exports()
        # python loads libmpi with dlopen, and torch manages its own thread affinity
        exports.setdefault("MV2_SUPPORT_DL", "1")
        exports.setdefault("MV2_ENABLE_AFFINITY", "0")
        exports.setdefault("MV2_SMP_USE_CMA", "0")
        return exports

    def hostfile_text(self):
        return "".join(f"{host}:{len(slots)}\n" for host, slots in self.resources.items())

    def prepare(self):
        with open(self.hostfile_path, "w", encoding="utf-8") as handle:
            handle.write(self.hostfile_text())

    def get_cmd(self):
        cmd = ["mpirun_rsh", "-np", str(self.world_size), "-hostfile", self.hostfile_path]
        cmd += self.launcher_args
        cmd += [f"{key}={value}" for key, value in self.worker_exports().items()]
        return cmd + self.program()


RUNNERS = {cls.name: cls for cls in (PDSHRunner, OpenMPIRunner, MPICHRunner, IMPIRunner,
                                     SlurmRunner, MVAPICHRunner)}


def launch_passthrough_flags(args):
    """Runner flags that the per-node launcher (launch.py) implements, as its arguments."""
    flags = []
    for attr in ("module", "no_python", "no_local_rank", "bind_cores_to_rank"):
        if getattr(args, attr, False):
            flags.append(f"--{attr}")
    if getattr(args, "bind_core_list", None):
        flags.append(f"--bind_core_list={args.bind_core_list}")
    if getattr(args, "enable_each_rank_log", None):
        flags.append(f"--enable_each_rank_log={args.enable_each_rank_log}")
    if getattr(args, "log_level", None):
        flags.append(f"--log_level={args.log_level}")
    return flags
