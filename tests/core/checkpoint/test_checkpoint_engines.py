"""Checkpoint engines (``checkpoint.checkpoint_engine``): torch, safetensors and asynchronous.

What is proved: the config keys parse and pick the right engine (DataStates/Nebula fall back to
the built-in async engine); safetensors files round-trip any checkpoint structure and resume a
run exactly; the async engine writes the same bytes as a synchronous save, keeps its snapshot
when training mutates the parameters afterwards, lets training steps finish while the write is
in flight (observed with events, never timed), and a SIGKILL in the middle of a background
write leaves ``latest`` on the previous tag, which still loads.
"""
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections import OrderedDict

import pytest
import torch

from tiny_models import mlp, regression_data

from deepspeed.checkpoint.atomic import CheckpointFormatError

BASE = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": None,
        "optimizer": {"type": "Adam", "params": {"lr": 0.01}}}


def config_with(engine_choice):
    return dict(BASE, checkpoint={"checkpoint_engine": engine_choice})


def make_engine(config, seed=0):
    import deepspeed

    engine, *_ = deepspeed.initialize(model=mlp(8, 16, 4, dropout=0.2, seed=seed),
                                      config=config)
    return engine


def train(engine, steps):
    from deepspeed import comm as dist

    losses = []
    for step in steps:
        x, y = regression_data(2, 8, 4, seed=100 * step + dist.get_rank())
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def params(engine):
    return [p.detach().clone() for p in engine.module.parameters()]


# ------------------------------------------------------------------ config and selection
class _Warnings(logging.Handler):
    """The DeepSpeed logger's warnings (it does not propagate to pytest's caplog)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.text = ""

    def emit(self, record):
        self.text += record.getMessage() + "\n"

    def __enter__(self):
        logging.getLogger("DeepSpeed").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("DeepSpeed").removeHandler(self)


def test_checkpoint_section_keys_parse_and_choose_the_engine():
    from deepspeed.checkpoint.engines import (AsyncCheckpointEngine, SafetensorsCheckpointEngine,
                                              TorchCheckpointEngine, build_checkpoint_engine)
    from deepspeed.config import DeepSpeedConfig
    from deepspeed.config.core_sections import CheckpointConfig, DataStatesConfig, NebulaConfig

    config = DeepSpeedConfig(dict(BASE, checkpoint={
        "tag_validation": "fail", "use_node_local_storage": True, "load_universal": True,
        "parallel_write": {"pipeline_stage": True},
        "checkpoint_engine": {"type": "async", "format": "safetensors"}}), world_size=1)
    assert config.checkpoint_tag_validation_fail and config.use_node_local_storage
    assert config.load_universal_checkpoint and config.checkpoint_parallel_write_pipeline
    built = build_checkpoint_engine(config.core.checkpoint)
    assert isinstance(built, AsyncCheckpointEngine)
    assert isinstance(built.writer, SafetensorsCheckpointEngine)

    assert type(build_checkpoint_engine(CheckpointConfig())) is TorchCheckpointEngine
    assert type(build_checkpoint_engine(CheckpointConfig(checkpoint_engine="safetensors"))) \
        is SafetensorsCheckpointEngine
    async_torch = build_checkpoint_engine(CheckpointConfig(checkpoint_engine="async"))
    assert isinstance(async_torch.writer, TorchCheckpointEngine)
    for bad, words in (("pickle", "'torch', 'safetensors' or 'async'"),
                       ({"type": "torch", "format": "safetensors"}, "contradicts type")):
        with pytest.raises(ValueError, match=words):
            CheckpointConfig(checkpoint_engine=bad)

    # DataStates / Nebula without their packages: the built-in async engine, with a warning
    with _Warnings() as warnings:
        chosen = build_checkpoint_engine(CheckpointConfig(),
                                         datastates=DataStatesConfig(host_cache_size=16))
    assert isinstance(chosen, AsyncCheckpointEngine)
    assert "DataStates-LLM is not installed" in warnings.text
    assert isinstance(build_checkpoint_engine(CheckpointConfig(),
                                              nebula=NebulaConfig(enabled=True)),
                      AsyncCheckpointEngine)
    assert type(build_checkpoint_engine(CheckpointConfig(), nebula=NebulaConfig())) \
        is TorchCheckpointEngine  # disabled nebula changes nothing
    # an explicit choice wins over the external sections
    assert type(build_checkpoint_engine(CheckpointConfig(checkpoint_engine="torch"),
                                        datastates=DataStatesConfig())) is TorchCheckpointEngine


# ------------------------------------------------------------------ safetensors files
def test_safetensors_file_round_trips_a_checkpoint_structure(tmp_path):
    from deepspeed.checkpoint import load_file
    from deepspeed.checkpoint.engines import SafetensorsCheckpointEngine

    flat = torch.arange(12, dtype=torch.float32)
    tied = torch.randn(3, 2)
    state = {
        "module": OrderedDict([("w", tied), ("alias", tied), ("half", torch.ones(2).bfloat16())]),
        "view": flat.view(3, 4)[:, 1],          # non-contiguous view of a larger buffer
        "scalars": {"step": torch.tensor(7), "mask": torch.tensor([True, False])},
        "empty": torch.empty(0, 5, dtype=torch.int8),
        "shapes": [OrderedDict([("w", torch.Size([3, 2]))])],
        "rng": ("python", (3, 4), None), "lr": 0.5, "name": "x", 7: "int key",
    }
    path = tmp_path / "mp_rank_00_model_states.pt"
    SafetensorsCheckpointEngine().save(state, path)
    with open(path, "rb") as f:
        assert not f.read(4).startswith(b"PK")  # really not a torch zip file
    loaded = load_file(path)
    assert loaded.keys() == state.keys()
    assert isinstance(loaded["module"], OrderedDict) and list(loaded["module"]) == ["w", "alias",
                                                                                   "half"]
    assert loaded["module"]["w"] is loaded["module"]["alias"]
    for key in ("w", "half"):
        assert loaded["module"][key].dtype == state["module"][key].dtype
        assert torch.equal(loaded["module"][key], state["module"][key])
    assert torch.equal(loaded["view"], flat.view(3, 4)[:, 1])
    assert torch.equal(loaded["scalars"]["mask"], state["scalars"]["mask"])
    assert loaded["scalars"]["step"].shape == () and int(loaded["scalars"]["step"]) == 7
    assert loaded["empty"].shape == (0, 5) and loaded["empty"].dtype == torch.int8
    assert loaded["shapes"] == state["shapes"] and loaded["rng"] == state["rng"]
    assert (loaded["lr"], loaded["name"], loaded[7]) == (0.5, "x", "int key")

    # one format: the tensors file is a plain safetensors file any safetensors tool reads,
    # under key-path names, the tied pair stored once; its metadata holds strings only
    from safetensors import safe_open
    from safetensors.torch import load_file as reference_load

    raw = reference_load(str(path))
    assert sorted(raw) == ["empty", "module.half", "module.w", "scalars.mask", "scalars.step",
                           "view"]
    assert torch.equal(raw["module.w"], tied)
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    assert metadata["format"] == "pt"
    assert metadata["deepspeed_state"] == path.name + ".state.json"
    assert all(len(value) < 100 for value in metadata.values())  # no state hidden in there
    # the rest of the state is JSON beside it, tensors referred to by name
    skeleton = json.loads((tmp_path / (path.name + ".state.json")).read_text())["skeleton"]
    top = dict(skeleton["$dict"])  # an int key (7) among the keys: the tagged form
    assert top["module"]["$odict"][0] == ["w", {"$tensor": "module.w"}]
    assert top["rng"] == {"$tuple": ["python", {"$tuple": [3, 4]}, None]} and top[7] == "int key"

    with pytest.raises(CheckpointFormatError, match=r"scalars.c: dtype torch.complex64"):
        SafetensorsCheckpointEngine().save(
            {"scalars": {"c": torch.zeros(2, dtype=torch.complex64)}}, tmp_path / "bad.pt",
            check=False)
    assert not os.path.exists(tmp_path / "bad.pt")


def test_safetensors_loading_refuses_pickles_and_mismatched_halves(tmp_path):
    """Loading never unpickles: the earlier format (a pickled skeleton in the metadata) is
    refused, and a skeleton from another save than its tensors is detected."""
    import pickle

    from safetensors.torch import save_file

    from deepspeed.checkpoint import load_file
    from deepspeed.checkpoint.engines import SafetensorsCheckpointEngine

    pickled = tmp_path / "old.pt"
    payload = pickle.dumps({"step": 3})
    save_file({"t0": torch.ones(2)}, str(pickled),
              metadata={"format": "deepspeed-checkpoint", "deepspeed_skeleton": payload.hex()})
    with pytest.raises(CheckpointFormatError, match="loading refuses pickles"):
        load_file(pickled)

    engine = SafetensorsCheckpointEngine()
    engine.save({"w": torch.ones(2), "step": 1}, tmp_path / "a.pt")
    first_skeleton = (tmp_path / "a.pt.state.json").read_text()
    engine.save({"w": torch.zeros(2), "step": 2}, tmp_path / "a.pt")
    (tmp_path / "a.pt.state.json").write_text(first_skeleton)  # as if the 2nd save died halfway
    with pytest.raises(CheckpointFormatError, match="come from different saves"):
        load_file(tmp_path / "a.pt")
    os.remove(tmp_path / "a.pt.state.json")
    with pytest.raises(CheckpointFormatError, match="copy both files of a checkpoint together"):
        load_file(tmp_path / "a.pt")
    # a plain safetensors file (a Hugging Face model) reads as its tensors
    save_file({"x": torch.arange(3)}, str(tmp_path / "model.safetensors"))
    assert torch.equal(load_file(tmp_path / "model.safetensors")["x"], torch.arange(3))


def _resume_with_engine(root, choice, extra):
    from deepspeed.checkpoint.engines.safetensors_format import is_safetensors

    config = dict(config_with(choice), **extra)
    torch.manual_seed(11)
    reference = make_engine(config)
    expected = train(reference, range(5))

    torch.manual_seed(11)
    first = make_engine(config)
    train(first, range(3))
    first.save_checkpoint(root, client_state={"epoch": 3})
    first.checkpoint_engine.wait()
    written = sorted(os.listdir(os.path.join(root, "global_step3")))
    safetensors_on_disk = []
    for name in written:  # every file, the ZeRO plugin's optimizer shards included
        if name.endswith(".state.json"):  # the non-tensor half beside each safetensors file
            continue
        with open(os.path.join(root, "global_step3", name), "rb") as f:
            safetensors_on_disk.append(is_safetensors(f.read(9)))
    first_losses = train(first, range(3, 5))  # the saved run goes on unaffected

    resumed = make_engine(config, seed=99)
    _, client_state = resumed.load_checkpoint(root)
    return (safetensors_on_disk, client_state, expected[3:], first_losses,
            train(resumed, range(3, 5)))


@pytest.mark.parametrize("choice, extra, safetensors", [
    ("safetensors", {}, True),
    ({"type": "async", "format": "safetensors"}, {}, True),
    ("async", {"zero_optimization": {"stage": 2}}, False),
    ("safetensors", {"zero_optimization": {"stage": 1}}, True),
], ids=["safetensors", "async-safetensors", "async-zero2", "safetensors-zero1"])
def test_engine_checkpoint_resumes_exactly(dist_pool, tmp_path, choice, extra, safetensors):
    for on_disk, client_state, expected, continued, resumed in dist_pool.run(
            _resume_with_engine, world_size=2, args=(str(tmp_path), choice, extra)):
        assert on_disk == [safetensors] * len(on_disk) and len(on_disk) >= 2
        assert client_state == {"epoch": 3}
        assert continued == expected and resumed == expected


# ------------------------------------------------------------------ asynchronous engine
def _files(directory):
    return {name: open(os.path.join(directory, name), "rb").read()
            for name in sorted(os.listdir(directory))}


def _async_save_in_flight(root):
    from deepspeed import comm as dist
    from deepspeed.checkpoint import load_file, read_latest
    from deepspeed.checkpoint.engines import (AsyncCheckpointEngine, TorchCheckpointEngine,
                                              checkpoint_engine_for)

    engine = make_engine(config_with("async"))
    assert isinstance(checkpoint_engine_for(engine), AsyncCheckpointEngine)
    train(engine, range(2))

    # same state, synchronous then asynchronous: the same bytes
    sync_dir, async_dir = os.path.join(root, "sync"), os.path.join(root, "async")
    engine.checkpoint_engine = TorchCheckpointEngine()
    engine.save_checkpoint(sync_dir, tag="a")
    engine.checkpoint_engine = AsyncCheckpointEngine(TorchCheckpointEngine())
    engine.save_checkpoint(async_dir, tag="a")
    assert engine.checkpoint_engine.wait() == "a"
    identical = _files(os.path.join(sync_dir, "a")) == _files(os.path.join(async_dir, "a"))

    # a save whose background write is held back until training has moved on
    writer = engine.checkpoint_engine
    gate, write_started = threading.Event(), threading.Event()
    real_save = writer.writer.save

    def held_back_save(state, path, check=True):
        write_started.set()
        assert gate.wait(60), "the test never released the writer"
        real_save(state, path, check=check)

    writer.writer.save = held_back_save
    saved_params = params(engine)
    engine.save_checkpoint(async_dir, tag="b")
    model_file = os.path.join(async_dir, "b", "mp_rank_00_model_states.pt")
    returned_before_written = not os.path.exists(model_file) and writer.in_flight
    latest_during_write = read_latest(async_dir)
    assert write_started.wait(60)
    train(engine, range(2, 4))  # in-place parameter updates while the files are pending
    step_finished_while_writing = not writer.write_finished.is_set()
    params_moved = any(not torch.equal(a, b) for a, b in zip(saved_params, params(engine)))
    gate.set()
    assert writer.wait() == "b"
    stored = load_file(model_file)["module"] if dist.get_rank() == 0 else None
    snapshot_kept = (stored is None or all(torch.equal(a, b) for a, b in
                                           zip(saved_params, stored.values())))
    return (identical, returned_before_written, latest_during_write, step_finished_while_writing,
            params_moved, snapshot_kept, read_latest(async_dir), writer.pending_tag)


def test_async_engine_overlaps_training_and_keeps_its_snapshot(dist_pool, tmp_path):
    for result in dist_pool.run(_async_save_in_flight, world_size=2, args=(str(tmp_path),)):
        (identical, returned_before_written, latest_during_write, overlapped, params_moved,
         snapshot_kept, latest_after, pending) = result
        assert identical, "the async engine wrote other bytes than a synchronous save"
        assert returned_before_written and latest_during_write == "a"
        assert overlapped and params_moved
        assert snapshot_kept, "training after save_checkpoint leaked into the saved weights"
        assert latest_after == "b" and pending is None


def _failed_background_write(root):
    from deepspeed import comm as dist
    from deepspeed.checkpoint import CheckpointWriteError, read_latest

    engine = make_engine(config_with("async"))
    train(engine, range(1))
    engine.save_checkpoint(root, tag="good")
    engine.checkpoint_engine.wait()
    if dist.get_rank() == 1:
        def disk_full(state, path, check=True):
            raise OSError(28, "No space left on device", path)
        engine.checkpoint_engine.writer.save = disk_full
    engine.save_checkpoint(root, tag="doomed")  # returns: the failure is in the background
    try:
        engine.checkpoint_engine.wait()
    except (OSError, CheckpointWriteError) as exc:
        return type(exc).__name__, read_latest(root)
    return None, read_latest(root)


def test_async_write_failure_is_raised_on_every_rank_at_commit(dist_pool, tmp_path):
    results = dist_pool.run(_failed_background_write, world_size=2, args=(str(tmp_path),))
    assert results == [("CheckpointWriteError", "good"), ("OSError", "good")]


KILLED_SCRIPT = textwrap.dedent("""
    import os, sys, threading, torch, deepspeed
    root = sys.argv[1]
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    engine, *_ = deepspeed.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 1, "steps_per_print": None,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "checkpoint": {"checkpoint_engine": "async"}})
    engine.save_checkpoint(root, tag="committed")
    engine.checkpoint_engine.wait()
    real_fsync = os.fsync
    def stall(fd):
        # the writer has written a whole temporary file and is about to make it durable
        if threading.current_thread().name.startswith("deepspeed-checkpoint-writer[doomed]"):
            print("MID-WRITE", flush=True)
            threading.Event().wait()
        real_fsync(fd)
    os.fsync = stall
    with torch.no_grad():
        model.weight.add_(1.0)
    engine.save_checkpoint(root, tag="doomed",
                           client_state={"big": torch.randn(4 * 1024 * 1024)})
    print("SAVE-RETURNED", flush=True)
    threading.Event().wait()
""")


def _killed_mid_write(root):
    import deepspeed
    from deepspeed.checkpoint import read_latest
    from deepspeed.testing.distributed import find_free_port

    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(find_free_port()))
    child = subprocess.Popen([sys.executable, "-c", KILLED_SCRIPT, root], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seen = []
    try:
        for line in child.stdout:
            seen.append(line.strip())
            if "MID-WRITE" in seen and "SAVE-RETURNED" in seen:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(60)
    leftovers = sorted(os.listdir(os.path.join(root, "doomed")))

    torch.manual_seed(0)
    fresh = torch.nn.Linear(64, 64)
    expected = fresh.weight.detach().clone()
    with torch.no_grad():
        fresh.weight.zero_()
    engine, *_ = deepspeed.initialize(model=fresh, config={
        "train_micro_batch_size_per_gpu": 1, "steps_per_print": None,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    path, _ = engine.load_checkpoint(root)
    return (seen, child.returncode, leftovers, read_latest(root), os.path.basename(
        os.path.dirname(path)), torch.equal(engine.module.weight, expected))


def test_sigkill_during_background_write_keeps_the_committed_tag(dist_pool, tmp_path):
    [(seen, returncode, leftovers, latest, loaded_tag, weights_match)] = dist_pool.run(
        _killed_mid_write, world_size=1, args=(str(tmp_path),))
    assert "SAVE-RETURNED" in seen and "MID-WRITE" in seen
    assert returncode == -signal.SIGKILL
    # killed between writing a temporary and renaming it: no final file of the doomed tag
    assert leftovers and all(name.startswith(".") for name in leftovers), leftovers
    assert latest == "committed" and loaded_tag == "committed" and weights_match
