"""Names and defaults shared by the `deepspeed` runner and the per-node launcher.

They live apart from the code that uses them so that tests and multi-node command builders agree on
one spelling of each launcher name, default port and file location.
"""

PDSH_LAUNCHER = "pdsh"
OPENMPI_LAUNCHER = "openmpi"
MPICH_LAUNCHER = "mpich"
IMPI_LAUNCHER = "impi"
SLURM_LAUNCHER = "slurm"
MVAPICH_LAUNCHER = "mvapich"
LAUNCHERS = (PDSH_LAUNCHER, OPENMPI_LAUNCHER, MPICH_LAUNCHER, IMPI_LAUNCHER, SLURM_LAUNCHER,
             MVAPICH_LAUNCHER)

# pdsh opens this many ssh connections at once; 1024 covers any realistic cluster in one wave.
PDSH_MAX_FAN_OUT = 1024

# The hostfile DLTS/Azure-style schedulers write; used only when it exists.
DLTS_HOSTFILE = "/job/hostfile"

TORCH_DISTRIBUTED_DEFAULT_PORT = 29500

# Environment variables whose names start with one of these prefixes are forwarded to remote nodes.
EXPORT_ENVS = ("MLFLOW", "NCCL", "PYTHON", "MV2", "UCX")

# `VAR=VALUE` lines in this file (cwd, then home, then $DS_ENV_FILE) reach every worker.
DEEPSPEED_ENVIRONMENT_NAME = ".deepspeed_env"
DS_ENV_FILE_VAR = "DS_ENV_FILE"

# mpirun_rsh only reads hosts from a file, so the mvapich runner writes one here before launching.
MVAPICH_TMP_HOSTFILE = "/tmp/deepspeed_mvapich_hostfile"

# `--save_pid` writes the per-node launcher's pid to PID_FILE_TEMPLATE.format(pid=<runner pid>).
PID_FILE_TEMPLATE = "/tmp/{pid}.deepspeed"

# Seconds between SIGTERM and SIGKILL when the launcher tears workers down.
KILL_GRACE_SECONDS = 5.0

# How often the per-node launcher checks on its workers.
POLL_INTERVAL_SECONDS = 0.1

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
