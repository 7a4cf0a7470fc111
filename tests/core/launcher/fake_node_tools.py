"""Stand-ins for `ssh`, `srun` and `pdsh` that reach the nodes of a FakeCluster.

Usage (written by FakeCluster into shims on PATH): `fake_node_tools.py CLUSTER_JSON TOOL ARGS...`.
CLUSTER_JSON maps each node address to its network namespace ("" = this machine's namespace).

Each tool behaves like the real one as far as a launcher can tell:
- ssh HOST CMD: runs CMD with `sh -c` on the node, in a fresh login environment (the caller's
  variables do not travel, as over a real ssh connection; only the suite's warm Python client
  does, standing for the node's own site configuration), starting in $HOME; an unknown host is
  unreachable (exit 255, OpenSSH's message).
- srun ... PROGRAM: starts `--ntasks-per-node` tasks on each `--nodelist` node with SLURM's task
  variables (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS, SLURM_STEP_NODELIST, ...)
  and, with --export=ALL, the caller's environment; with --kill-on-bad-exit a task that fails
  ends the step, as srun documents. Failed tasks are reported as `srun: error: HOST: task R: ...`.
- pdsh -w HOSTS CMD: runs CMD over `ssh` on every host at once with %n / %h replaced, output
  prefixed with `HOST: `; -S returns the largest remote exit status (only used when the real pdsh
  is not installed).
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SSH_OPTS_WITH_VALUE = set("bcDEeFIiJLlmOoPpQRSWw")


def _on_node(namespace, argv):
    return (["ip", "netns", "exec", namespace] + argv) if namespace else argv


def _exit_words(code):
    if code < 0:
        return {signal.SIGKILL: "Killed", signal.SIGTERM: "Terminated"}.get(
            -code, f"Killed by signal {-code}")
    return f"Exited with exit code {code}"


def _shell_code(code):
    return 128 - code if code < 0 else code


def _machine_warm_python():
    """The warm Python client's two variables (``deepspeed.testing.warm_python``), when the
    suite runs with one: they stand for the nodes' own site configuration, as every node has
    its own warm server (FakeCluster), so that a login shell's Python (the per-node launcher of
    the pdsh and --no_ssh forms, and the ranks it starts) runs warm on its node instead of
    importing torch afresh. Nothing of the caller's own environment travels."""
    folder = os.environ.get("DS_WARM_PYTHON")
    site = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.isfile(os.path.join(p, "_ds_warm_python_client.py"))]
    return {"DS_WARM_PYTHON": folder, "PYTHONPATH": site[0]} if folder and site else {}


def ssh(cluster, argv):
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        i += 1
        if arg == "--":
            break
        if arg[1] in SSH_OPTS_WITH_VALUE and len(arg) == 2:
            i += 1  # the value is the next word
    if i >= len(argv):
        print("usage: ssh [options] destination [command]", file=sys.stderr)
        return 255
    host = argv[i].rpartition("@")[2]
    command = " ".join(argv[i + 1:]) or "true"
    if host not in cluster:
        print(f"ssh: connect to host {host} port 22: No route to host", file=sys.stderr)
        return 255
    home = os.path.expanduser("~")
    env = {"HOME": home, "PATH": LOGIN_PATH, "SHELL": "/bin/sh", "LANG": "C.UTF-8",
           "USER": os.environ.get("USER", "root"), "LOGNAME": os.environ.get("USER", "root"),
           "SSH_CONNECTION": f"fake {host}", "DS_FAKE_NODE": host, **_machine_warm_python()}
    os.chdir(home)
    argv = _on_node(cluster[host], ["sh", "-c", command])
    os.execvpe(argv[0], argv, env)
    return 255  # not reached


def _srun_options(argv):
    opts = {"kill_on_bad_exit": False, "export": "ALL", "ntasks": None, "nodes": None,
            "ppn": None, "nodelist": None}
    names = {"-n": "ntasks", "--ntasks": "ntasks", "-N": "nodes", "--nodes": "nodes",
             "--ntasks-per-node": "ppn", "-w": "nodelist", "--nodelist": "nodelist",
             "--export": "export", "--jobid": None, "-J": None, "--job-name": None}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        i += 1
        key, sep, value = arg.partition("=")
        if key in ("-K", "--kill-on-bad-exit"):
            opts["kill_on_bad_exit"] = (value or "1") != "0"
            continue
        if key in ("-l", "--label", "-u", "--unbuffered"):
            continue
        if key not in names:
            print(f"srun: unrecognized option '{arg}'", file=sys.stderr)
            sys.exit(1)
        if not sep:
            value = argv[i]
            i += 1
        if names[key]:
            opts[names[key]] = value
    return opts, argv[i:]


def srun(cluster, argv):
    opts, program = _srun_options(argv)
    hosts = opts["nodelist"].split(",") if opts["nodelist"] else [next(iter(cluster))]
    unknown = [h for h in hosts if h not in cluster]
    if unknown or not program:
        print(f"srun: error: Invalid node name specified: {','.join(unknown)}" if unknown
              else "srun: fatal: No command given to execute.", file=sys.stderr)
        return 1
    ntasks = int(opts["ntasks"] or len(hosts))
    ppn = int(opts["ppn"] or -(-ntasks // len(hosts)))
    job_id = str(os.getpid())
    base = dict(os.environ) if opts["export"].upper().startswith("ALL") else {"PATH": LOGIN_PATH}
    tasks = []
    for node_id, host in enumerate(hosts):
        for local_id in range(ppn):
            rank = node_id * ppn + local_id
            if rank >= ntasks:
                break
            env = dict(base)
            env.update({"SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_STEP_ID": "0",
                        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local_id),
                        "SLURM_NODEID": str(node_id), "SLURM_NTASKS": str(ntasks),
                        "SLURM_NPROCS": str(ntasks), "SLURM_NNODES": str(len(hosts)),
                        "SLURM_JOB_NUM_NODES": str(len(hosts)),
                        "SLURM_STEP_NUM_NODES": str(len(hosts)),
                        "SLURM_STEP_NUM_TASKS": str(ntasks),
                        "SLURM_STEP_NODELIST": ",".join(hosts),
                        "SLURM_JOB_NODELIST": ",".join(hosts), "SLURM_NODELIST": ",".join(hosts),
                        "SLURM_TASKS_PER_NODE": f"{ppn}(x{len(hosts)})", "SLURMD_NODENAME": host,
                        "DS_FAKE_NODE": host})
            tasks.append((rank, host, subprocess.Popen(_on_node(cluster[host], program), env=env)))

    def forward(signum, _frame):
        for _rank, _host, proc in tasks:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    reported, worst = set(), 0
    while True:
        running = [t for t in tasks if t[2].poll() is None]
        for rank, host, proc in tasks:
            code = proc.returncode
            if code is not None and code != 0 and rank not in reported:
                reported.add(rank)
                worst = max(worst, _shell_code(code))
                print(f"srun: error: {host}: task {rank}: {_exit_words(code)}", file=sys.stderr,
                      flush=True)
        if not running:
            return worst
        if reported and opts["kill_on_bad_exit"]:
            print(f"srun: error: Terminating StepId={job_id}.0 (--kill-on-bad-exit)",
                  file=sys.stderr, flush=True)
            for _rank, _host, proc in running:
                proc.terminate()
            deadline = time.monotonic() + 5
            while any(p.poll() is None for _r, _h, p in running) and time.monotonic() < deadline:
                time.sleep(0.1)
            for _rank, _host, proc in running:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            return worst
        time.sleep(0.1)


def pdsh(cluster, argv):
    hosts, strict, i = [], False, 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        i += 1
        if arg == "-S":
            strict = True
        elif arg in ("-w", "-f", "-R", "-u", "-l", "-t"):
            if arg == "-w":
                hosts = argv[i].split(",")
            i += 1
    command = " ".join(argv[i:])
    procs = []
    for index, host in enumerate(hosts):
        remote = command.replace("%n", str(index)).replace("%h", host)
        procs.append((host, subprocess.Popen(["ssh", "-2", "-a", "-x", host, remote],
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             text=True)))

    def relay(host, stream):
        for line in stream:
            sys.stdout.write(f"{host}: {line}")
            sys.stdout.flush()

    threads = [threading.Thread(target=relay, args=(h, p.stdout), daemon=True) for h, p in procs]
    for thread in threads:
        thread.start()
    worst = 0
    for (host, proc), thread in zip(procs, threads):
        code = proc.wait()
        thread.join()
        if code:
            print(f"pdsh@{os.uname().nodename}: {host}: ssh exited with exit code {code}",
                  file=sys.stderr, flush=True)
            worst = max(worst, _shell_code(code))
    return worst if strict else 0


def main():
    cluster_file, tool, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    with open(cluster_file, encoding="utf-8") as handle:
        cluster = json.load(handle)
    return {"ssh": ssh, "srun": srun, "pdsh": pdsh}[tool](cluster, argv)


if __name__ == "__main__":
    sys.exit(main())
