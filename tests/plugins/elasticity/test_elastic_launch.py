"""``deepspeed --elastic_training`` on one machine, each "node" its own command (``--no_ssh
--node_rank i``): a job on 2 workers loses one (its node is killed), keeps training on 1, takes a
new one back to 2, and finishes. The global batch stays the elastic plan's 16 samples at every
world size, each restart resumes from the latest checkpoint, and the final weights equal plain
PyTorch training on the same global batches (every step's batch is seeded by its number)."""
import json
import os
import subprocess
import sys
import time

import torch

from deepspeed.testing.distributed import find_free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(REPO, "examples", "elasticity", "train.py")
STEPS = 24
NODE_TAG = "DS_TEST_ELASTIC_NODE"  # marks the processes of one "node" (see _kill_node)


def _node(tmp_path, port, node_rank, name):
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--elastic_training", "--no_ssh",
           "--node_rank", str(node_rank), "--num_gpus", "1", "--min_elastic_nodes", "1",
           "--max_elastic_nodes", "2", "--master_port", str(port), SCRIPT, "--steps", str(STEPS),
           "--log", "steps.jsonl", "--step_sleep", "0.4"]
    log = open(tmp_path / f"{name}.log", "w")  # closed with the process's lifetime (test end)
    env = dict(os.environ, **{NODE_TAG: f"{tmp_path}:{name}"})
    return subprocess.Popen(cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def _kill_node(proc):
    """SIGKILL a node's launcher and everything it started: its process tree, and every process
    carrying the node's tag (torch elastic starts workers in sessions of their own, so the
    process group alone is not enough; under the suite's warm Python the programs are forks of
    the warm server, outside the tree, and each one's client, which carries the tag, takes its
    program along when it dies)."""
    import psutil

    parent = psutil.Process(proc.pid)
    tag = parent.environ()[NODE_TAG]
    victims = {p.pid: p for p in parent.children(recursive=True) + [parent]}
    for other in psutil.process_iter():
        try:
            if other.pid not in victims and other.environ().get(NODE_TAG) == tag:
                victims[other.pid] = other
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
    for victim in victims.values():
        try:
            victim.kill()
        except psutil.NoSuchProcess:
            continue


def _records(tmp_path):
    path = tmp_path / "steps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_for(tmp_path, what, predicate, procs, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = _records(tmp_path)
        if predicate(records):
            return records
        dead = [p for p in procs if p.poll() is not None and p.returncode != 0]
        assert not dead, f"a node failed while waiting for {what}"
        time.sleep(0.5)
    logs = "\n".join(p.read_text()[-2000:] for p in tmp_path.glob("*.log"))
    raise AssertionError(f"timed out waiting for {what}; records {_records(tmp_path)}\n{logs}")


def _reference_weights():
    sys.path.insert(0, os.path.dirname(SCRIPT))
    sys.path.insert(0, os.path.dirname(os.path.dirname(SCRIPT)))
    import importlib

    train = importlib.import_module("train")
    torch.manual_seed(0)
    model = train.GPT(train.MODEL)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for step in range(STEPS):
        x, y = train.global_batch(step, 16)
        losses = [model(x[i:i + 4], y[i:i + 4]) for i in range(0, 16, 4)]
        (sum(losses) / len(losses)).backward()
        opt.step()
        opt.zero_grad()
    return model.state_dict()


def test_two_one_two_workers(tmp_path):
    port = find_free_port()
    a = _node(tmp_path, port, 0, "node_a")
    b = _node(tmp_path, port, 1, "node_b")
    procs = [a, b]
    try:
        # a checkpoint exists (every 2 steps) before the first worker dies
        first = _wait_for(tmp_path, "2 workers past a checkpoint",
                          lambda r: any(x["world"] == 2 and x["step"] >= 3 for x in r), procs)
        _kill_node(b)  # node b dies: its agent and its worker
        b.wait()
        procs = [a]
        seen = len(first)
        # ... and the single worker saves one of its own before the new worker joins
        _wait_for(tmp_path, "1 worker past a checkpoint",
                  lambda r: any(x["world"] == 1 and x["step"] % 2 == 0
                                and x["step"] > x["resumed_from"] for x in r[seen:]), procs)
        c = _node(tmp_path, port, 1, "node_c")
        procs = [a, c]
        _wait_for(tmp_path, "2 workers again",
                  lambda r: any(x["world"] == 1 for x in r[seen:]) and r[-1]["world"] == 2
                  and any(x["world"] == 1 for x in r[seen:][:-1]), procs)
        assert a.wait(timeout=240) == 0 and c.wait(timeout=60) == 0
    finally:
        for proc in (a, b) + ((c,) if "c" in locals() else ()):
            if proc.poll() is None:
                _kill_node(proc)
    records = _records(tmp_path)
    worlds = [r["world"] for r in records]
    assert worlds[0] == 2 and 1 in worlds and worlds[-1] == 2
    phases = [w for i, w in enumerate(worlds) if i == 0 or worlds[i - 1] != w]
    assert phases[:3] == [2, 1, 2], phases
    assert {r["train_batch_size"] for r in records} == {16}  # the elastic plan's batch, always
    assert {(r["world"], r["micro"], r["gas"]) for r in records} == {(2, 4, 2), (1, 4, 4)}
    assert records[-1]["step"] == STEPS
    # each start resumes from the latest checkpoint: steps continue (re-doing at most the
    # steps since the last save), and no start goes back to the beginning
    for prev, cur in zip(records, records[1:]):
        if cur["resumed_from"] != prev["resumed_from"]:
            assert cur["step"] == cur["resumed_from"] + 1
            assert cur["resumed_from"] >= 2 and prev["step"] - 2 <= cur["resumed_from"] <= prev["step"]
    final = torch.load(tmp_path / "elastic_checkpoints" / "final_model.pt")
    reference = _reference_weights()
    for name, value in reference.items():
        # float noise only: reductions over 1 or 2 ranks, re-done steps, the SIMD Adam
        assert torch.allclose(final[name], value, atol=1e-4), name
