"""``ds_ssh``: run one shell command on every host of a hostfile.

    ds_ssh -f hostfile 'nvidia-smi -L'      # default hostfile: /job/hostfile

The hosts are the launcher's (same hostfile format and checks). With ``pdsh`` on PATH the command
goes through it over ssh (``PDSH_RCMD_TYPE=ssh``), as upstream's script does; without pdsh each
host gets its own ``ssh`` at once. Either way every output line is prefixed with its host, and the
exit status is the worst of the remote ones (0 when all succeeded), so a script can tell that a
node failed.
"""
import argparse
import os
import shutil
import subprocess
import sys
import threading

from deepspeed.launcher import constants as C
from deepspeed.launcher.hostfile import parse_hostfile


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="ds_ssh", description="Run a command on every host of a hostfile (pdsh, else ssh).")
    parser.add_argument("-f", "--hostfile", default=C.DLTS_HOSTFILE,
                        help=f"hostfile with '<host> slots=<N>' lines (default {C.DLTS_HOSTFILE})")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command; its words are joined and run by each host's shell")
    args = parser.parse_args(argv)
    if not args.command:
        parser.error("no command given: ds_ssh [-f HOSTFILE] COMMAND...")
    return args


def read_hosts(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return list(parse_hostfile(handle.readlines(), source=path))
    except FileNotFoundError:
        raise SystemExit(f"ds_ssh: hostfile '{path}' does not exist (pass -f HOSTFILE)") from None
    except ValueError as err:
        raise SystemExit(f"ds_ssh: {err}") from None


def _relay(host, stream, out):
    for line in stream:
        out.write(f"{host}: {line}")
        out.flush()


def run_over_ssh(hosts, command, out=None):
    """``ssh HOST COMMAND`` on every host at once; the worst exit status."""
    out = out or sys.stdout
    procs = [(host, subprocess.Popen(["ssh", host, command], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)) for host in hosts]
    threads = [threading.Thread(target=_relay, args=(host, proc.stdout, out), daemon=True)
               for host, proc in procs]
    for thread in threads:
        thread.start()
    worst = 0
    for (host, proc), thread in zip(procs, threads):
        code = proc.wait()
        thread.join()
        if code:
            print(f"ds_ssh: {host}: ssh exited with exit code {code}", file=sys.stderr, flush=True)
            worst = max(worst, code if code > 0 else 128 - code)
    return worst


def run_over_pdsh(hosts, command):
    """pdsh over ssh (``-S``: pdsh's status is the largest remote one)."""
    env = dict(os.environ, PDSH_RCMD_TYPE="ssh")
    return subprocess.call(["pdsh", "-S", "-f", str(C.PDSH_MAX_FAN_OUT), "-w", ",".join(hosts),
                            command], env=env)


def main(argv=None):
    args = parse_args(argv)
    hosts = read_hosts(args.hostfile)
    command = " ".join(args.command)
    if shutil.which("pdsh"):
        return run_over_pdsh(hosts, command)
    if shutil.which("ssh") is None:
        raise SystemExit("ds_ssh: neither pdsh nor ssh is on PATH (install pdsh or openssh-client)")
    return run_over_ssh(hosts, command)


if __name__ == "__main__":
    sys.exit(main())
