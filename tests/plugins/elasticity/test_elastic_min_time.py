"""``elasticity.min_time``: the elastic agent takes in waiting nodes only once min_time has
passed since the workers last (re)started (its decision and rendezvous gate, no real launch)."""
import json

from deepspeed.elasticity.min_time import MinTimeRendezvous, admitted, min_time_from_args
from deepspeed.launcher import runner

ELASTIC = {"enabled": True, "max_train_batch_size": 8, "micro_batch_sizes": [2],
           "min_gpus": 1, "max_gpus": 4, "min_time": 20, "version": 0.1}


class _Rendezvous:
    """torch's c10d handler, reduced to what the gate uses."""

    def __init__(self):
        self.waiting, self.rounds = 0, 0

    def next_rendezvous(self):
        self.rounds += 1
        return f"round {self.rounds}"

    def num_nodes_waiting(self):
        return self.waiting

    def get_run_id(self):
        return "run"


def test_the_decision_holds_nodes_back_until_min_time():
    assert admitted(2, 0.0, 0) == 2  # no min_time: at once
    assert admitted(2, 1199.0, 1200) == 0
    assert admitted(2, 1200.0, 1200) == 2
    assert admitted(0, 5000.0, 1200) == 0


def test_waiting_nodes_are_admitted_only_after_min_time(tmp_path, capsys):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"elasticity": ELASTIC}))
    user_args = ["--deepspeed_config", str(config)]
    min_time_s = min_time_from_args(user_args)
    assert min_time_s == 20 * 60
    assert min_time_from_args([f"--deepspeed_config={config}"]) == min_time_s
    assert min_time_from_args(["--steps", "3"]) == 0  # no config file: nothing to wait for

    now = [100.0]
    inner = _Rendezvous()
    gate = MinTimeRendezvous(inner, min_time_s, clock=lambda: now[0])
    assert gate.next_rendezvous() == "round 1" and gate.get_run_id() == "run"
    inner.waiting = 1
    now[0] += min_time_s - 1
    assert gate.num_nodes_waiting() == 0  # the agent keeps training with the current group
    now[0] += 1
    assert gate.num_nodes_waiting() == 1  # ... and restarts with the new node now
    gate.next_rendezvous()  # the restart: the clock starts again
    now[0] += 60
    assert gate.num_nodes_waiting() == 0

    # the launcher plans the gated rendezvous from the script's --deepspeed_config
    status = runner.main(["--elastic_training", "--dry_run", "--num_gpus", "1", "--no_ssh",
                          "--node_rank", "0", "--master_port", "29124", "train.py",
                          *user_args])
    out = capsys.readouterr().out
    assert status == 0
    assert "'rdzv_backend': 'deepspeed-c10d-min-time'" in out
    assert "'deepspeed_min_time_s': 1200" in out
