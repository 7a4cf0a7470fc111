"""``deepspeed.autotuning.scheduler``: upstream's experiment scheduler, for code that runs its own
autotuning experiments on a pool of hosts.

An experiment is a json file (what the autotuner writes into ``exps_dir``): ``name``,
``ds_config``, ``num_gpus`` (per node, default all) and ``num_nodes`` (default 1), optionally
``result_dir``. ``ResourceManager.run()`` starts each queued experiment as soon as enough idle
slots exist (``Node`` / ``Reservation`` keep the accounting), each as its own ``deepspeed``
launch limited to its slots with ``--include``, several at once when the slots allow, and waits
for all of them. An experiment's metrics are the json its run writes to
``autotuning.metric_path`` of its config, else ``<result_dir>/metrics.json``;
``parse_results(metric)`` picks the best. ``deepspeed --autotuning`` itself runs experiments
one after another on every slot (``autotuner.py``); this class is the upstream API around the
same job runner (``jobs``).
"""
import json
import os
import subprocess
import sys
import threading
import time

from deepspeed.autotuning import jobs
from deepspeed.autotuning.report import HIGHER_IS_BETTER, score

METRICS_FILENAME = "metrics.json"


def metrics_path(exp):
    """Where an experiment's run writes its metrics: ``autotuning.metric_path`` of its config,
    else ``<result_dir>/metrics.json``."""
    section = exp["ds_config"].get("autotuning") or {}
    return section.get("metric_path") or os.path.join(exp["result_dir"], METRICS_FILENAME)


def get_user():
    return os.environ.get("USER") or os.environ.get("LOGNAME") or "unknown-user"


def get_job_id():
    return os.environ.get("DLWS_JOB_ID") or os.environ.get("SLURM_JOB_ID") or "unknown-job-id"


class Node:
    """One host and its slots (device indices); ``idle_slots`` are those not reserved."""

    def __init__(self, host, max_slots):
        self.host = host
        self.max_slots = max_slots
        self.idle_slots = list(range(max_slots))

    def reserve_slots(self, slot_request):
        """The first ``slot_request`` idle slots, now reserved; None when too few are idle."""
        if len(self.idle_slots) < slot_request:
            return None
        taken, self.idle_slots = self.idle_slots[:slot_request], self.idle_slots[slot_request:]
        return taken

    def restore_slots(self, slots):
        self.idle_slots = sorted(set(self.idle_slots) | set(slots))


class Reservation:
    """Slots reserved on one node for one experiment."""

    def __init__(self, node, slots):
        self.node = node
        self.slots = slots

    def restore_slots(self):
        self.node.restore_slots(self.slots)

    def desc(self):
        """``host:slot,slot``: the ``--include`` syntax."""
        return f"{self.node.host}:{','.join(str(s) for s in self.slots)}"


def _hosts(hosts, num_gpus_per_node):
    """``[(host, slots)]`` from a list of names, a ``"h1,h2"`` string or ``{host: slots}``."""
    if isinstance(hosts, dict):
        return [(str(h).strip(), int(n)) for h, n in hosts.items()]
    if isinstance(hosts, str):
        hosts = hosts.split(",")
    return [(str(h).strip(), int(num_gpus_per_node)) for h in hosts if str(h).strip()]


def run_experiment(exp, reservations, user_script, user_args, command=None):
    """Run one experiment on ``reservations`` through the ``deepspeed`` launcher; returns its
    exit status. ``command`` (a ``jobs.UserCommand``) supplies the launcher flags to keep and
    where the config path sits among the script's arguments; without it ``user_args`` must hold
    ``--deepspeed_config``/``--deepspeed`` followed by a path, which is replaced."""
    result_dir = exp["result_dir"]
    os.makedirs(result_dir, exist_ok=True)
    config_path = os.path.join(result_dir, "ds_config.json")
    with open(config_path, "w", encoding="utf-8") as handle:
        json.dump(exp["ds_config"], handle, indent=2)
    script_args = list(user_args)
    if command is not None:
        script_args = command.with_config(config_path, exp.get("arg_values"))
    else:
        for flag in jobs.CONFIG_FLAGS:
            if flag in script_args:
                script_args[script_args.index(flag) + 1] = config_path
                break
        else:
            raise ValueError(f"experiment {exp['name']!r}: none of {jobs.CONFIG_FLAGS} among the "
                             f"script arguments {script_args}, so its config cannot be passed")
        for flag, value in (exp.get("arg_values") or {}).items():
            script_args = jobs.set_flag(script_args, flag, str(value))
    kept = [] if command is None else _without_resource_flags(command.launcher_flags)
    launch = ([sys.executable, "-u", "-m", "deepspeed.launcher.runner", *kept,
               "--include", "@".join(r.desc() for r in reservations),
               "--master_port", str(jobs.free_port()), user_script] + script_args)
    with open(os.path.join(result_dir, "cmd.txt"), "w", encoding="utf-8") as handle:
        handle.write(" ".join(launch) + "\n")
    with open(os.path.join(result_dir, "stdout_stderr.log"), "w", encoding="utf-8") as log:
        return subprocess.run(launch, stdout=log, stderr=subprocess.STDOUT, check=False).returncode


_RESOURCE_FLAGS = ("--include", "-i", "--exclude", "-e", "--num_nodes", "--num_gpus",
                   "--num_accelerators", "--master_port")


def _without_resource_flags(flags):
    """The launcher flags minus those choosing slots or a port (each experiment has its own)."""
    out, i = [], 0
    while i < len(flags):
        name = flags[i].split("=", 1)[0]
        if name in _RESOURCE_FLAGS:
            i += 1 if "=" in flags[i] else 2
            continue
        out.append(flags[i])
        i += 1
    return out


class ResourceManager:
    """Schedules experiment files onto ``hosts`` (module docstring). ``args`` are the
    ``deepspeed`` runner's parsed arguments (``user_script``, ``user_args`` and the command
    line); ``arg_mappings`` maps config keys to the script flags that must carry their values
    (``{"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"}``)."""

    def __init__(self, args, hosts, num_gpus_per_node, results_dir, exps_dir, arg_mappings):
        self.args = args
        self.results_dir = results_dir
        self.exps_dir = exps_dir
        self.num_gpus_per_node = num_gpus_per_node
        self.nodes = [Node(host, slots) for host, slots in _hosts(hosts, num_gpus_per_node)]
        self.experiment_queue = []
        self.running_experiments = {}
        self.finished_experiments = {}
        self.experiment_count = 0
        self.exp_paths = set()
        self.arg_mappings = {}
        for key, flag in (arg_mappings or {}).items():
            self.arg_mappings.setdefault(key.strip(), flag.strip())
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the queue
    def schedule_experiments(self, exp_paths):
        """Queue each experiment file once (a path already scheduled is skipped)."""
        for path in exp_paths:
            if path in self.exp_paths:
                continue
            self.exp_paths.add(path)
            with open(path, encoding="utf-8") as handle:
                exp = json.load(handle)
            exp["exp_id"] = self.experiment_count
            self.experiment_count += 1
            exp.setdefault("result_dir", os.path.join(self.results_dir, exp["name"]))
            exp["arg_values"] = self._arg_values(exp["ds_config"])
            self.experiment_queue.append(exp)

    def _arg_values(self, config):
        from deepspeed.autotuning.autotuner import dotted_get

        values = {}
        for key, flag in self.arg_mappings.items():
            value = dotted_get(config, key)
            if value is not None:
                values[flag] = value
        return values

    def resource_request(self, exp):
        """Reservations of ``num_gpus`` slots on each of ``num_nodes`` nodes, or None (nothing
        reserved) when not enough are idle now."""
        per_node = int(exp.get("num_gpus") or self.num_gpus_per_node)
        wanted = int(exp.get("num_nodes") or 1)
        reservations = []
        for node in self.nodes:
            if len(reservations) == wanted:
                break
            slots = node.reserve_slots(per_node)
            if slots is not None:
                reservations.append(Reservation(node, slots))
        if len(reservations) < wanted:
            for reservation in reservations:
                reservation.restore_slots()
            return None
        return reservations

    def _fits_at_all(self, exp):
        per_node = int(exp.get("num_gpus") or self.num_gpus_per_node)
        return sum(node.max_slots >= per_node for node in self.nodes) >= int(
            exp.get("num_nodes") or 1)

    # ------------------------------------------------------------------ running
    def run_job(self, exp, reservations):
        command = None
        if getattr(self.args, "command_line", None) is not None:
            command = jobs.split_command(self.args, self.args.command_line)
        code = run_experiment(exp, reservations, self.args.user_script,
                              list(self.args.user_args), command)
        with self._lock:
            self.finished_experiments[exp["exp_id"]] = (exp, code)
            self.running_experiments.pop(exp["exp_id"], None)
            for reservation in reservations:
                reservation.restore_slots()

    def run(self, poll_seconds=0.2):
        """Run every queued experiment (each when its slots are free); returns when all ended."""
        for exp in self.experiment_queue:
            if not self._fits_at_all(exp):
                raise ValueError(f"experiment {exp['name']!r} asks for {exp.get('num_nodes', 1)} "
                                 f"node(s) x {exp.get('num_gpus')} slots; the hosts have "
                                 f"{[(n.host, n.max_slots) for n in self.nodes]}")
        threads = []
        while self.experiment_queue or any(t.is_alive() for t in threads):
            with self._lock:
                if self.experiment_queue:
                    reservations = self.resource_request(self.experiment_queue[0])
                    if reservations is not None:
                        exp = self.experiment_queue.pop(0)
                        self.running_experiments[exp["exp_id"]] = (exp, reservations)
                        thread = threading.Thread(target=self.run_job, args=(exp, reservations))
                        thread.start()
                        threads.append(thread)
                        continue
            time.sleep(poll_seconds)
        for thread in threads:
            thread.join()

    def status(self):
        return {"queued": len(self.experiment_queue), "running": len(self.running_experiments),
                "finished": len(self.finished_experiments),
                "idle_slots": {node.host: list(node.idle_slots) for node in self.nodes}}

    # ------------------------------------------------------------------ results
    def parse_results(self, metric):
        """``(best experiment id, its metric value)`` over the finished experiments that wrote
        metrics (higher throughput / FLOPS, lower latency), or ``(None, None)``."""
        if metric not in HIGHER_IS_BETTER:
            raise ValueError(f"metric {metric!r} is not one of {sorted(HIGHER_IS_BETTER)}")
        best = (None, None)
        for exp_id, (exp, _code) in sorted(self.finished_experiments.items()):
            path = metrics_path(exp)
            if not os.path.isfile(path):
                continue
            with open(path, encoding="utf-8") as handle:
                metrics = json.load(handle)
            if metric not in metrics:
                continue
            if best[0] is None or score(metric, metrics) > score(metric, {metric: best[1]}):
                best = (exp_id, float(metrics[metric]))
        return best

    def clear(self):
        """Forget every experiment and free every slot."""
        self.experiment_queue = []
        self.running_experiments = {}
        self.finished_experiments = {}
        self.exp_paths = set()
        for node in self.nodes:
            node.idle_slots = list(range(node.max_slots))


__all__ = ["ResourceManager", "Node", "Reservation", "run_experiment", "get_job_id", "get_user"]
