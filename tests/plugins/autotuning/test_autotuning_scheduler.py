"""``deepspeed.autotuning.scheduler.ResourceManager``: slot accounting, experiments scheduled onto
free slots (concurrently when they fit), the command each runs, and the best result picked."""
import json
import os
import threading
import time
from types import SimpleNamespace

import pytest

from deepspeed.autotuning import scheduler
from deepspeed.autotuning.scheduler import Node, Reservation, ResourceManager


def _experiments(tmp_path, specs):
    paths = []
    for name, num_gpus, num_nodes in specs:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"name": name, "num_gpus": num_gpus, "num_nodes": num_nodes,
                                    "ds_config": {"train_micro_batch_size_per_gpu": num_gpus}}))
        paths.append(str(path))
    return paths


def test_arg_mappings_and_hosts_are_normalised():
    rm = ResourceManager(None, "worker-0, worker-1", 4, None, None,
                         {" train_micro_batch_size_per_gpu ": " --per_device_train_batch_size "})
    assert rm.arg_mappings == {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"}
    assert [(n.host, n.max_slots) for n in rm.nodes] == [("worker-0", 4), ("worker-1", 4)]
    assert ResourceManager(None, ["a"], 2, None, None, None).arg_mappings == {}


def test_slots_are_reserved_and_restored():
    node = Node("w", 4)
    assert node.reserve_slots(3) == [0, 1, 2] and node.reserve_slots(2) is None
    reservation = Reservation(node, [0, 1, 2])
    assert reservation.desc() == "w:0,1,2"
    reservation.restore_slots()
    assert node.idle_slots == [0, 1, 2, 3]


def test_run_schedules_onto_free_slots_and_picks_the_best(tmp_path, monkeypatch):
    """Two 1-node experiments share two 2-slot hosts at once; the 2-node one waits for both."""
    running, peak, launched = [], [0], []
    lock = threading.Lock()

    def fake_run(exp, reservations, user_script, user_args, command=None):
        with lock:
            running.append(exp["name"])
            peak[0] = max(peak[0], len(running))
            launched.append((exp["name"], [r.desc() for r in reservations], exp["arg_values"]))
        time.sleep(0.3)
        os.makedirs(exp["result_dir"], exist_ok=True)
        with open(os.path.join(exp["result_dir"], "metrics.json"), "w") as handle:
            json.dump({"throughput": {"a": 10.0, "b": 30.0, "c": 20.0}[exp["name"]],
                       "latency": {"a": 5.0, "b": 1.0, "c": 2.0}[exp["name"]]}, handle)
        with lock:
            running.remove(exp["name"])
        return 0

    monkeypatch.setattr(scheduler, "run_experiment", fake_run)
    args = SimpleNamespace(user_script="train.py", user_args=["--deepspeed", "ds.json"])
    rm = ResourceManager(args, ["h0", "h1"], 2, str(tmp_path / "results"), str(tmp_path),
                         {"train_micro_batch_size_per_gpu": "--batch"})
    paths = _experiments(tmp_path, [("a", 2, 1), ("b", 2, 1), ("c", 2, 2)])
    rm.schedule_experiments(paths + paths[:1])  # a path given twice runs once
    rm.run(poll_seconds=0.05)
    assert peak[0] == 2 and len(launched) == 3
    assert dict((n, d) for n, d, _ in launched) == {"a": ["h0:0,1"], "b": ["h1:0,1"],
                                                    "c": ["h0:0,1", "h1:0,1"]}
    assert launched[0][2] == {"--batch": 2}
    assert rm.parse_results("throughput") == (1, 30.0)
    assert rm.parse_results("latency") == (1, 1.0)
    assert rm.status()["finished"] == 3 and rm.status()["idle_slots"] == {"h0": [0, 1],
                                                                        "h1": [0, 1]}
    rm.clear()
    assert rm.status()["finished"] == 0


def test_an_experiment_larger_than_the_pool_is_refused(tmp_path):
    rm = ResourceManager(None, ["h0"], 2, str(tmp_path), str(tmp_path), None)
    rm.schedule_experiments(_experiments(tmp_path, [("big", 4, 1)]))
    with pytest.raises(ValueError, match="'big' asks for"):
        rm.run()


def test_the_command_an_experiment_runs(tmp_path, monkeypatch):
    """The launcher runs the script on the reserved slots with the experiment's config file and
    the mapped flags (the subprocess itself is replaced: it would start a training job)."""
    seen = {}

    def fake_subprocess_run(cmd, **kwargs):
        seen["cmd"] = cmd
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(scheduler.subprocess, "run", fake_subprocess_run)
    exp = {"name": "x", "result_dir": str(tmp_path / "x"), "ds_config": {"a": 1},
           "arg_values": {"--batch": 4}}
    code = scheduler.run_experiment(exp, [Reservation(Node("localhost", 2), [0, 1])], "train.py",
                                    ["--deepspeed", "old.json", "--batch", "1"])
    cmd = seen["cmd"]
    config = str(tmp_path / "x" / "ds_config.json")
    assert code == 0 and cmd[cmd.index("--include") + 1] == "localhost:0,1"
    assert cmd[cmd.index("train.py"):] == ["train.py", "--deepspeed", config, "--batch", "4"]
    assert json.loads(open(config).read()) == {"a": 1}
