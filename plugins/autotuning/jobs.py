"""Experiments as jobs: each one is the user's command, run again through the ``deepspeed``
launcher with the same resource flags, its own config file, and (``arg_mappings``) the script
flags that carry the tuned values rewritten. Output goes to per-experiment log files."""
import json
import os
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import List, Optional

CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed", "--deepscale_config")
EXP_TIMEOUT_ENV = "DS_AUTOTUNING_EXP_TIMEOUT"  # seconds per experiment, default 1800


@dataclass
class UserCommand:
    """The ``deepspeed`` command line split into what the autotuner keeps and what it changes."""

    launcher_flags: List[str]  # runner flags, without --autotuning
    script: str
    script_args: List[str]
    config_index: int  # index into script_args of the config path

    @property
    def config_path(self):
        return self.script_args[self.config_index]

    def with_config(self, path: str, arg_values: Optional[dict] = None) -> List[str]:
        """The script's arguments for a job that reads its config from ``path``; ``arg_values``
        maps script flags to the values they must carry (appended when absent)."""
        args = list(self.script_args)
        args[self.config_index] = path
        for flag, value in (arg_values or {}).items():
            args = set_flag(args, flag, str(value))
        return args

    def runner_command(self, script_args: List[str]) -> List[str]:
        flags = list(self.launcher_flags)
        given = {f.split("=", 1)[0] for f in flags}
        if not given & {"--master_port", "-H", "--hostfile"}:
            # each job its own rendezvous port: the previous experiment's port may still be
            # held while its processes exit, and other jobs on the machine use the default
            flags += ["--master_port", str(free_port())]
        return ([sys.executable, "-u", "-m", "deepspeed.launcher.runner"] + flags
                + [self.script] + script_args)

    def display(self, script_args: List[str]) -> str:
        return shlex.join(["deepspeed"] + self.launcher_flags + [self.script] + script_args)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def set_flag(args: List[str], flag: str, value: str) -> List[str]:
    out, i, found = [], 0, False
    while i < len(args):
        if args[i] == flag and i + 1 < len(args):
            out += [flag, value]
            i, found = i + 2, True
            continue
        if args[i].startswith(flag + "="):
            out.append(f"{flag}={value}")
            i, found = i + 1, True
            continue
        out.append(args[i])
        i += 1
    return out if found else out + [flag, value]


def _strip_autotuning(flags: List[str]) -> List[str]:
    out, i = [], 0
    while i < len(flags):
        if flags[i] == "--autotuning":
            i += 2
            continue
        if flags[i].startswith("--autotuning="):
            i += 1
            continue
        out.append(flags[i])
        i += 1
    return out


def split_command(args, argv: List[str]) -> UserCommand:
    """Find the launcher flags, the script and the config path in the original command line."""
    tail = 1 + len(args.user_args)
    if len(argv) < tail or argv[len(argv) - tail] != args.user_script:
        raise ValueError(f"cannot find the script {args.user_script!r} in the command line "
                         f"{shlex.join(argv)}")
    launcher_flags = _strip_autotuning(argv[:len(argv) - tail])
    script_args = list(args.user_args)
    for flag in CONFIG_FLAGS:
        for i, token in enumerate(script_args):
            if token == flag and i + 1 < len(script_args) and \
                    not script_args[i + 1].startswith("-") and os.path.isfile(script_args[i + 1]):
                return UserCommand(launcher_flags, args.user_script, script_args, i + 1)
            if token.startswith(flag + "=") and os.path.isfile(token.split("=", 1)[1]):
                script_args[i:i + 1] = [flag, token.split("=", 1)[1]]
                return UserCommand(launcher_flags, args.user_script, script_args, i + 1)
    raise ValueError("autotuning needs the DeepSpeed config file among the script's arguments "
                     "(e.g. 'script.py --deepspeed ds_config.json' or '--deepspeed_config "
                     f"ds_config.json'); none of {', '.join(CONFIG_FLAGS)} names an existing file "
                     f"in: {shlex.join(args.user_args) or '(no arguments)'}")


@dataclass
class JobResult:
    name: str
    metrics: Optional[dict]
    returncode: Optional[int]
    log_path: str
    reused: bool = False
    error: str = ""

    @property
    def ok(self):
        return self.metrics is not None

    @property
    def out_of_memory(self):
        return "out of memory" in self.error.lower()


def _last_error_line(log_path: str) -> str:
    try:
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            lines = [line.strip() for line in handle.readlines()[-200:] if line.strip()]
    except OSError:
        return ""
    for line in reversed(lines):
        if "Error" in line or "error" in line or "out of memory" in line.lower():
            return line[:300]
    return lines[-1][:300] if lines else ""


def run_job(command: UserCommand, name: str, config: dict, exp_dir: str, result_file: str,
            arg_values: Optional[dict], overwrite: bool, env=None) -> JobResult:
    """Run one experiment (or reuse its earlier result when the config is the same and
    ``overwrite`` is false); the metrics are the json the probe writes to ``result_file``."""
    os.makedirs(exp_dir, exist_ok=True)
    config_path = os.path.join(exp_dir, "ds_config.json")
    log_path = os.path.join(exp_dir, "stdout_stderr.log")
    if not overwrite and os.path.isfile(result_file) and os.path.isfile(config_path):
        with open(config_path, encoding="utf-8") as handle:
            if json.load(handle) == config:
                with open(result_file, encoding="utf-8") as handle:
                    return JobResult(name, json.load(handle), 0, log_path, reused=True)
    if os.path.exists(result_file):
        os.remove(result_file)
    with open(config_path, "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2)
    script_args = command.with_config(config_path, arg_values)
    with open(os.path.join(exp_dir, "cmd.txt"), "w", encoding="utf-8") as handle:
        handle.write(command.display(script_args) + "\n")
    timeout = float(os.environ.get(EXP_TIMEOUT_ENV, "1800"))
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            proc = subprocess.run(command.runner_command(script_args), stdout=log,
                                  stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = None
    if code == 0 and os.path.isfile(result_file):
        with open(result_file, encoding="utf-8") as handle:
            return JobResult(name, json.load(handle), code, log_path)
    error = f"timed out after {timeout:.0f} s" if code is None else _last_error_line(log_path)
    if code == 0:
        error = ("the job finished without writing metrics: it ran fewer steps than "
                 "autotuning.end_profile_step, or did not train through deepspeed.initialize")
    return JobResult(name, None, code, log_path, error=error)
