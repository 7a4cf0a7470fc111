"""Engine checkpoints on 2 gloo ranks: resume equals an uninterrupted run, the layout on disk,
what goes wrong (a save that dies half-way, missing directories and tags, disagreeing tags,
client state that could not be loaded safely) and the load options.

The reference is always computed in the same test: the same run without a checkpoint. Dropout
makes the loss depend on the RNG, so equality also proves the per-rank RNG state came back.
"""
import logging
import os

import pytest
import torch

from deepspeed import hookimpl
from tiny_models import mlp, regression_data

TOTAL, SAVE_AT = 6, 3
CONFIG = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": None,
          "optimizer": {"type": "Adam", "params": {"lr": 0.01}}}


def make_model(seed):
    return mlp(8, 16, 4, dropout=0.3, seed=seed)


def warmup(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4))


def make_engine(seed, config=None):
    import deepspeed

    engine, *_ = deepspeed.initialize(model=make_model(seed), config=config or CONFIG,
                                      lr_scheduler=warmup)
    return engine


def batch(step, rank):
    return regression_data(2, 8, 4, seed=1000 * step + rank)


def train(engine, steps):
    from deepspeed import comm as dist

    losses = []
    for step in steps:
        x, y = batch(step, dist.get_rank())
        dtype = next(engine.module.parameters()).dtype  # bf16 modules take bf16 inputs
        loss = torch.nn.functional.mse_loss(engine(x.to(dtype)).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def snapshot(engine):
    inner = getattr(engine, "basic_optimizer", engine.optimizer)  # under fp32 master weights
    return {"params": [p.detach().clone() for p in engine.module.parameters()],
            "masters": [p.detach().clone() for g in inner.param_groups for p in g["params"]],
            "opt_state": inner.state_dict()["state"], "lr": engine.get_lr(),
            "sched_epoch": engine.lr_scheduler.last_epoch if engine.lr_scheduler else None,
            "steps": engine.global_steps, "samples": engine.global_samples,
            "micro": engine.micro_steps}


def _uninterrupted_and_resumed(save_dir, config):
    from deepspeed.checkpoint import load_checkpoint, save_checkpoint

    torch.manual_seed(1234)
    reference = make_engine(0, config)
    ref_losses = train(reference, range(TOTAL))
    ref = snapshot(reference)

    torch.manual_seed(1234)
    first = make_engine(0, config)
    first_losses = train(first, range(SAVE_AT))
    assert save_checkpoint(first, save_dir, client_state={"epoch": 7,
                                                          "cursor": torch.tensor([3, 4])})
    torch.manual_seed(777)  # whatever happens in between must not matter after loading
    fresh = make_engine(99, config)  # different initial weights
    assert not torch.equal(next(fresh.module.parameters()), next(first.module.parameters()))
    path, client_state = load_checkpoint(fresh, save_dir)
    resumed_losses = train(fresh, range(SAVE_AT, TOTAL))
    return (ref_losses, ref, first_losses + resumed_losses, snapshot(fresh), path,
            client_state)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_resume_equals_uninterrupted_run(dist_pool, tmp_path, precision):
    config = dict(CONFIG)
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    results = dist_pool.run(_uninterrupted_and_resumed, args=(str(tmp_path), config))
    for ref_losses, ref, losses, got, path, client_state in results:
        assert losses == ref_losses  # bitwise: same dropout masks, same weights, same moments
        for want, have in zip(ref["params"] + ref["masters"], got["params"] + got["masters"]):
            assert torch.equal(want, have)
        assert ref["opt_state"].keys() == got["opt_state"].keys()
        for index, state in ref["opt_state"].items():
            for key, value in state.items():
                other = got["opt_state"][index][key]
                same = torch.equal(value, other) if torch.is_tensor(value) else value == other
                assert same, (index, key)
        assert (got["lr"], got["steps"], got["samples"], got["micro"]) == \
            (ref["lr"], ref["steps"], ref["samples"], ref["micro"]) == \
            (ref["lr"], TOTAL, TOTAL * 4, TOTAL)
        assert path == os.path.join(str(tmp_path), "global_step3", "mp_rank_00_model_states.pt")
        assert client_state.keys() == {"epoch", "cursor"}
        assert client_state["epoch"] == 7 and torch.equal(client_state["cursor"],
                                                          torch.tensor([3, 4]))
    # the results of both ranks are the same model
    for a, b in zip(results[0][3]["params"], results[1][3]["params"]):
        assert torch.equal(a, b)


def _save_and_list(save_dir):
    import deepspeed

    # the engine's own methods, and a scheduler built from the config this time
    config = {**CONFIG, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}
    engine, *_ = deepspeed.initialize(model=make_model(0), config=config)
    train(engine, range(4))
    assert engine.save_checkpoint(save_dir, client_state={"epoch": 7})
    engine.save_checkpoint(save_dir, tag=11, save_latest=False)
    fresh, *_ = deepspeed.initialize(model=make_model(1), config=config)
    path, client_state = fresh.load_checkpoint(save_dir)
    assert client_state == {"epoch": 7} and path.endswith("mp_rank_00_model_states.pt")
    assert fresh.get_lr() == engine.get_lr() and fresh.global_steps == 4
    assert fresh.lr_scheduler.state_dict() == engine.lr_scheduler.state_dict()
    return engine.module.state_dict()


def test_layout_and_weights_only_contents(dist_pool, tmp_path):
    weights = dist_pool.run(_save_and_list, args=(str(tmp_path),))[0]
    assert sorted(os.listdir(tmp_path)) == ["11", "global_step4", "latest"]
    assert (tmp_path / "latest").read_text() == "global_step4"  # save_latest=False kept it
    for tag in ("global_step4", "11"):
        assert sorted(os.listdir(tmp_path / tag)) == [
            "mp_rank_00_model_states.pt", "rng_state_rank_0.pt", "rng_state_rank_1.pt"]
    state = torch.load(tmp_path / "global_step4" / "mp_rank_00_model_states.pt",
                       weights_only=True)
    expected = {"module", "optimizer", "lr_scheduler", "global_steps", "global_samples",
                "skipped_steps", "micro_steps", "dp_world_size", "mp_world_size", "ds_config",
                "ds_version", "buffer_names", "param_shapes", "frozen_param_shapes",
                "shared_params", "client_state_keys", "plugin_states", "epoch"}
    assert set(state) == expected
    assert state["plugin_states"] == {}  # no enabled plugin hands over a Stateful object
    assert (state["global_steps"], state["dp_world_size"], state["mp_world_size"]) == (4, 2, 1)
    assert state["ds_version"] == __import__("deepspeed").__version__
    assert state["ds_config"]["optimizer"]["type"] == "Adam"
    assert state["ds_config"]["train_batch_size"] == 4
    assert [dict(g) for g in state["param_shapes"]] == [
        {name: w.shape for name, w in weights.items()}]
    assert state["client_state_keys"] == ["epoch"]
    for name, value in weights.items():
        assert torch.equal(state["module"][name], value)
    rng = torch.load(tmp_path / "global_step4" / "rng_state_rank_1.pt", weights_only=True)
    assert {"python", "numpy", "torch"} <= set(rng)

class _Logs(logging.Handler):
    """Collect the DeepSpeed logger's warnings (it does not propagate to pytest's caplog)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("DeepSpeed").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("DeepSpeed").removeHandler(self)


def _interrupted_save(save_dir):
    from deepspeed.checkpoint import CheckpointWriteError, load_checkpoint, save_checkpoint

    engine = make_engine(0)
    train(engine, range(2))
    save_checkpoint(engine, save_dir)
    saved = snapshot(engine)
    train(engine, range(2, 3))

    real_save, files = torch.save, []

    def dying_save(obj, f, *args, **kwargs):
        if not hasattr(f, "name"):  # in-memory serialisation (the weights-only check)
            return real_save(obj, f, *args, **kwargs)
        files.append(f.name)
        if len(files) == 1:
            return real_save(obj, f, *args, **kwargs)
        f.write(b"half a checkpoint")
        raise OSError(28, "No space left on device (simulated)")

    torch.save = dying_save
    try:
        with pytest.raises((OSError, CheckpointWriteError)) as failure:
            save_checkpoint(engine, save_dir)
    finally:
        torch.save = real_save

    left = sorted(os.listdir(os.path.join(save_dir, "global_step3")))
    latest = open(os.path.join(save_dir, "latest")).read()
    fresh = make_engine(5)
    path, _ = load_checkpoint(fresh, save_dir)
    return (type(failure.value).__name__, str(failure.value), len(files), left, latest, path,
            saved, snapshot(fresh))


def test_save_killed_mid_write_keeps_previous_checkpoint(dist_pool, tmp_path):
    results = dist_pool.run(_interrupted_save, args=(str(tmp_path),))
    # rank 0 writes model states then its RNG file and dies on the second; rank 1 only writes
    # its RNG file, succeeds, and is told that rank 0 failed
    (error0, _, files0, left, latest, path, saved, loaded) = results[0]
    (error1, message1, files1, *_rest) = results[1]
    assert (error0, files0) == ("OSError", 2)
    assert (error1, files1) == ("CheckpointWriteError", 1)
    assert "rank(s) [0]" in message1 and "'latest' not updated" in message1
    assert latest == "global_step2"
    # no temporary and no torn file: the finished model-states file and rank 1's RNG file only
    assert left == ["mp_rank_00_model_states.pt", "rng_state_rank_1.pt"]
    assert path.endswith(os.path.join("global_step2", "mp_rank_00_model_states.pt"))
    for rank_result in results:
        saved, loaded = rank_result[6], rank_result[7]
        assert loaded["steps"] == saved["steps"] == 2
        for want, have in zip(saved["params"], loaded["params"]):
            assert torch.equal(want, have)


def _missing(root):
    from deepspeed.checkpoint import load_checkpoint, save_checkpoint

    engine = make_engine(0)
    errors = {}
    with pytest.raises(FileNotFoundError) as exc:
        load_checkpoint(engine, os.path.join(root, "nowhere"), tag="x")
    errors["no_dir_tag"] = str(exc.value)
    empty = os.path.join(root, "empty")
    os.makedirs(empty, exist_ok=True)
    before = [p.detach().clone() for p in engine.module.parameters()]
    # no checkpoint to resume from (an empty directory, or one not created yet): the
    # documented None load path and a warning, and the engine is left as it was
    with _Logs() as logs:
        no_latest = {"empty": engine.load_checkpoint(empty),
                     "no_dir": engine.load_checkpoint(os.path.join(root, "nowhere"))}
    unchanged = all(torch.equal(a, b) for a, b in zip(before, engine.module.parameters()))
    save_checkpoint(engine, os.path.join(root, "ckpts"), tag="first")
    save_checkpoint(engine, os.path.join(root, "ckpts"), tag="second")
    with pytest.raises(FileNotFoundError) as exc:
        load_checkpoint(engine, os.path.join(root, "ckpts"), tag="third")
    errors["no_tag"] = str(exc.value)
    with pytest.raises(ValueError) as exc:
        save_checkpoint(engine, os.path.join(root, "ckpts"), tag="../escape")
    errors["bad_tag"] = str(exc.value)
    return errors, no_latest, logs.messages, unchanged


def test_missing_directory_tag_and_latest(dist_pool, tmp_path):
    errors, no_latest, warnings, unchanged = dist_pool.run(_missing, args=(str(tmp_path),))[0]
    nowhere = os.path.join(str(tmp_path), "nowhere")
    assert f"'{nowhere}' does not exist" in errors["no_dir_tag"]
    assert "tag 'third' not found" in errors["no_tag"]
    assert "['first', 'second']" in errors["no_tag"]
    assert "'../escape' is not a valid directory name" in errors["bad_tag"]
    assert not os.path.exists(tmp_path / "escape")
    assert no_latest == {"empty": (None, None), "no_dir": (None, None)} and unchanged
    assert sum("Unable to find latest file" in w for w in warnings) == 2
    assert any(f"directory '{nowhere}' does not exist" in w for w in warnings)


def _rank_dependent_tag(save_dir, mode):
    from deepspeed import comm as dist
    from deepspeed.checkpoint import CheckpointTagMismatchError, save_checkpoint

    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": None,
              "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
              "checkpoint": {"tag_validation": mode}}
    engine = make_engine(0, config)
    with _Logs() as logs:
        same = save_checkpoint(engine, save_dir, tag="same")
        try:
            save_checkpoint(engine, save_dir, tag=f"rank{dist.get_rank()}")
            outcome = "saved"
        except CheckpointTagMismatchError as exc:
            outcome = f"failed: {exc}"
    return same, outcome, [m for m in logs.messages if "tag" in m]


@pytest.mark.parametrize("mode", ["Ignore", "Warn", "Fail"])
def test_tag_validation_modes(dist_pool, tmp_path, mode):
    results = dist_pool.run(_rank_dependent_tag, args=(str(tmp_path), mode))
    latest = (tmp_path / "latest").read_text()
    for rank, (same, outcome, warnings) in enumerate(results):
        assert same is True
        if mode == "Fail":
            assert outcome.startswith(f"failed: checkpoint tag 'rank{rank}' on rank {rank} "
                                      f"differs")
            assert latest == "same"  # nothing was written under a disagreeing tag
        else:
            assert outcome == "saved"
            assert latest == "rank0"
        if mode == "Warn":
            assert len(warnings) == 1 and "differs from the tag" in warnings[0]
        else:
            assert [w for w in warnings if "differs" in w] == []
    if mode == "Fail":
        assert sorted(os.listdir(tmp_path)) == ["latest", "same"]


def _unsafe_client_state(save_dir):
    import argparse

    from deepspeed.checkpoint import CheckpointFormatError, save_checkpoint

    engine = make_engine(0)
    with pytest.raises(CheckpointFormatError) as exc:
        save_checkpoint(engine, save_dir, client_state={"args": argparse.Namespace(lr=1)})
    with pytest.raises(ValueError) as clash:
        save_checkpoint(engine, save_dir, client_state={"global_steps": 5})
    return str(exc.value), str(clash.value)


def test_client_state_must_load_weights_only_and_not_shadow_engine_keys(dist_pool, tmp_path):
    for message, clash in dist_pool.run(_unsafe_client_state, args=(str(tmp_path),)):
        assert "client_state['args']" in message and "argparse.Namespace" in message
        assert "weights_only=True" in message
        assert "['global_steps'] are reserved" in clash
    assert not os.path.exists(tmp_path / "latest")


def _load_options(save_dir):
    from deepspeed.checkpoint import load_checkpoint, save_checkpoint

    engine = make_engine(0)
    train(engine, range(3))
    save_checkpoint(engine, save_dir, client_state={"epoch": 2})
    saved = snapshot(engine)
    outcome = {}

    fresh = make_engine(9)
    _, client = load_checkpoint(fresh, save_dir, load_module_only=True)
    outcome["module_only"] = (snapshot(fresh), client)

    fresh = make_engine(9)
    load_checkpoint(fresh, save_dir, load_optimizer_states=False)
    outcome["no_optimizer"] = snapshot(fresh)

    fresh = make_engine(9)
    load_checkpoint(fresh, save_dir, load_lr_scheduler_states=False)
    outcome["no_scheduler"] = snapshot(fresh)

    calls = []
    fresh = make_engine(9)
    load_checkpoint(fresh, save_dir, custom_load_fn=lambda src, dst: calls.append(
        (sorted(src), dst is fresh.module)))
    outcome["custom_calls"] = calls
    outcome["custom_params"] = snapshot(fresh)["params"]

    bigger = make_engine(9)
    bigger.module.add_module("extra", torch.nn.Linear(2, 2))
    with pytest.raises(RuntimeError) as strict_error:
        load_checkpoint(bigger, save_dir)
    outcome["strict_error"] = str(strict_error.value)
    load_checkpoint(bigger, save_dir, load_module_strict=False)
    outcome["lenient_params"] = snapshot(bigger)["params"][:4]
    return saved, outcome, make_engine(9).get_lr()


def test_load_options(dist_pool, tmp_path):
    saved, outcome, initial_lr = dist_pool.run(_load_options, args=(str(tmp_path),))[0]

    def same_params(params):
        return all(torch.equal(a, b) for a, b in zip(saved["params"], params))

    module_only, client = outcome["module_only"]
    assert same_params(module_only["params"]) and client == {"epoch": 2}
    assert saved["sched_epoch"] == 3 and saved["lr"] != initial_lr
    assert (module_only["steps"], module_only["opt_state"], module_only["lr"],
            module_only["sched_epoch"]) == (0, {}, initial_lr, 0)

    no_optimizer = outcome["no_optimizer"]  # fresh moments; the scheduler sets the group lr
    assert same_params(no_optimizer["params"]) and no_optimizer["opt_state"] == {}
    assert (no_optimizer["steps"], no_optimizer["lr"], no_optimizer["sched_epoch"]) == \
        (3, saved["lr"], 3)

    no_scheduler = outcome["no_scheduler"]  # the schedule starts over
    assert no_scheduler["steps"] == 3 and no_scheduler["sched_epoch"] == 0
    assert no_scheduler["opt_state"].keys() == saved["opt_state"].keys()

    names = ["0.bias", "0.weight", "3.bias", "3.weight"]
    assert outcome["custom_calls"] == [(names, True)]  # called once; the core loaded nothing
    assert not same_params(outcome["custom_params"])
    assert "unexpected keys []" in outcome["strict_error"]
    assert "'extra.weight', 'extra.bias'" in outcome["strict_error"]
    assert same_params(outcome["lenient_params"])


def _frozen_and_16bit(root):
    from deepspeed.checkpoint import load_checkpoint, save_16bit_model, save_checkpoint

    def frozen_engine(seed, config=None):
        model = make_model(seed)
        model[0].requires_grad_(False)
        import deepspeed

        return deepspeed.initialize(model=model, config=config or CONFIG)[0]

    engine = frozen_engine(0)
    train(engine, range(2))
    ckpt = os.path.join(root, "ckpt")
    save_checkpoint(engine, ckpt, exclude_frozen_parameters=True)
    fresh = frozen_engine(0)  # same frozen layer, the trained layer differs after loading
    load_checkpoint(fresh, ckpt)  # strict: the excluded frozen keys are not "missing"
    loaded = [p.detach().clone() for p in fresh.module.parameters()]

    full = save_16bit_model(engine, os.path.join(root, "out"))
    trainable = save_16bit_model(engine, os.path.join(root, "out"), "trainable.bin",
                                 exclude_frozen_parameters=True)
    bf16 = frozen_engine(0, {**CONFIG, "bf16": {"enabled": True}})
    half = save_16bit_model(bf16, os.path.join(root, "out"), "bf16.bin")
    return (full, trainable, half, engine.module.state_dict(), loaded,
            bf16.module.state_dict())


def test_exclude_frozen_parameters_and_save_16bit_model(dist_pool, tmp_path):
    full, trainable, half, weights, loaded, bf16_weights = dist_pool.run(
        _frozen_and_16bit, args=(str(tmp_path),))[0]
    assert full is trainable is half is True
    state = torch.load(tmp_path / "ckpt" / "global_step2" / "mp_rank_00_model_states.pt",
                       weights_only=True)
    assert sorted(state["module"]) == ["3.bias", "3.weight"]
    assert sorted(state["frozen_param_shapes"]) == ["0.bias", "0.weight"]
    for want, have in zip(weights.values(), loaded):
        assert torch.equal(want, have)

    out = torch.load(tmp_path / "out" / "pytorch_model.bin", weights_only=True)
    assert out.keys() == weights.keys()
    assert all(torch.equal(out[k], v) for k, v in weights.items())
    assert sorted(torch.load(tmp_path / "out" / "trainable.bin", weights_only=True)) == \
        ["3.bias", "3.weight"]
    half_out = torch.load(tmp_path / "out" / "bf16.bin", weights_only=True)
    assert {t.dtype for t in half_out.values()} == {torch.bfloat16}
    assert all(torch.equal(half_out[k], v) for k, v in bf16_weights.items())
    assert sorted(os.listdir(tmp_path / "out")) == ["bf16.bin", "pytorch_model.bin",
                                                    "trainable.bin"]


def _node_local(root):
    from deepspeed import comm as dist
    from deepspeed.checkpoint import load_checkpoint, save_checkpoint

    config = {**CONFIG, "checkpoint": {"use_node_local_storage": True}}
    rank = dist.get_rank()
    node_dir = os.path.join(root, f"node{rank}")  # each emulated node has its own disk
    engine = make_engine(0, config)
    engine.local_rank = 0  # one rank per node: each is its node's local rank 0
    train(engine, range(2))
    save_checkpoint(engine, node_dir)
    saved = snapshot(engine)
    fresh = make_engine(3, config)
    fresh.local_rank = 0
    load_checkpoint(fresh, node_dir)
    files = sorted(os.listdir(os.path.join(node_dir, "global_step2")))
    return sorted(os.listdir(node_dir)), files, saved, snapshot(fresh)


def test_node_local_storage_writes_model_states_on_every_node(dist_pool, tmp_path):
    for rank, (top, files, saved, loaded) in enumerate(
            dist_pool.run(_node_local, args=(str(tmp_path),))):
        assert top == ["global_step2", "latest"]
        assert files == ["mp_rank_00_model_states.pt", f"rng_state_rank_{rank}.pt"]
        assert loaded["steps"] == 2
        assert all(torch.equal(a, b) for a, b in zip(saved["params"], loaded["params"]))


class _ShardedStatePlugin:
    """A plugin in the shape ZeRO will take: it keeps the optimizer state in per-rank files of
    its own, adds an entry to the model-states file, and declines to save 16-bit weights."""

    def __init__(self):
        self.calls = []

    def _shard(self, checkpoint_dir):
        from deepspeed import comm as dist

        return os.path.join(checkpoint_dir, f"plugin_optim_rank_{dist.get_rank()}.pt")

    @hookimpl
    def deepspeed_save_optimizer_state(self, engine, checkpoint_dir):
        from deepspeed.checkpoint import atomic_torch_save

        atomic_torch_save(engine.optimizer.state_dict(), self._shard(checkpoint_dir))
        return True

    @hookimpl
    def deepspeed_save_checkpoint(self, tag, state):
        self.calls.append(("save", tag, state["optimizer"]))
        state["plugin_counter"] = 41

    @hookimpl
    def deepspeed_load_optimizer_state(self, engine, checkpoint_dir):
        from deepspeed.checkpoint import load_file

        engine.optimizer.load_state_dict(load_file(self._shard(checkpoint_dir)))
        return True

    @hookimpl
    def deepspeed_load_checkpoint(self, tag, state, load_module_only):
        self.calls.append(("load", tag, state["plugin_counter"], load_module_only))

    @hookimpl
    def deepspeed_save_16bit_model(self, save_filename):
        self.calls.append(("16bit", save_filename))
        return False


def _with_plugin(save_dir):
    from deepspeed.checkpoint import load_checkpoint, save_16bit_model, save_checkpoint

    engine = make_engine(0)
    plugin = _ShardedStatePlugin()
    engine.plugins.register(plugin)
    train(engine, range(2))
    save_checkpoint(engine, save_dir, client_state={"epoch": 1})
    saved = snapshot(engine)
    wrote_16bit = save_16bit_model(engine, save_dir)

    fresh = make_engine(4)
    fresh_plugin = _ShardedStatePlugin()
    fresh.plugins.register(fresh_plugin)
    _, client_state = load_checkpoint(fresh, save_dir)
    return plugin.calls, fresh_plugin.calls, wrote_16bit, client_state, saved, snapshot(fresh)


def test_plugins_take_part_through_the_checkpoint_hooks(dist_pool, tmp_path):
    for saver, loader, wrote_16bit, client_state, saved, loaded in dist_pool.run(
            _with_plugin, args=(str(tmp_path),)):
        assert saver == [("save", "global_step2", None), ("16bit", "pytorch_model.bin")]
        assert loader == [("load", "global_step2", 41, False)]
        assert wrote_16bit is False and client_state == {"epoch": 1}  # plugin keys stay private
        for index, state in saved["opt_state"].items():
            assert torch.equal(state["exp_avg"], loaded["opt_state"][index]["exp_avg"])
    assert sorted(os.listdir(tmp_path)) == ["global_step2", "latest"]  # no pytorch_model.bin
    assert sorted(os.listdir(tmp_path / "global_step2")) == [
        "mp_rank_00_model_states.pt", "plugin_optim_rank_0.pt", "plugin_optim_rank_1.pt",
        "rng_state_rank_0.pt", "rng_state_rank_1.pt"]
    state = torch.load(tmp_path / "global_step2" / "mp_rank_00_model_states.pt",
                       weights_only=True)
    assert state["optimizer"] is None and state["plugin_counter"] == 41


def _bf16_module_only(save_dir):
    from deepspeed.checkpoint import load_checkpoint, save_checkpoint

    config = {**CONFIG, "bf16": {"enabled": True}}
    engine = make_engine(0, config)
    train(engine, range(2))
    save_checkpoint(engine, save_dir)
    fresh = make_engine(8, config)
    load_checkpoint(fresh, save_dir, load_module_only=True)
    masters = [m.detach().clone() for m in fresh.precision.master_params()]
    return [p.detach().float() for p in fresh.module.parameters()], masters


def test_module_only_load_refreshes_fp32_master_weights(dist_pool, tmp_path):
    weights, masters = dist_pool.run(_bf16_module_only, args=(str(tmp_path),))[0]
    assert len(weights) == len(masters) == 4
    for weight, master in zip(weights, masters):
        assert torch.equal(weight, master)
