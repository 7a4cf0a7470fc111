"""``save_checkpoint`` / ``load_checkpoint`` of a ``PipelineEngine``: per-layer weight files,
bit-identical resume at the same pipeline shape, weights-only loads at another number of stages,
and ``module_state_dict`` / ``load_module_state_dict`` (api-part2 §1.B)."""
import os

import pytest
import torch

from deepspeed.checkpoint import load_file
from pipe_training import BASE_SEED, MICRO, batches, mse, specs

GAS = 2
TAG = "ckpt"
OPTIMIZERS = {
    "AdamW": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
    "SGD": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}},
}


def _engine(stages, optimizer="AdamW", seed=BASE_SEED, tied=False, extra=None):
    import deepspeed
    from deepspeed.pipe import PipelineModule

    model = PipelineModule(specs(tied), num_stages=stages, loss_fn=mse, seed_layers=True,
                           base_seed=seed, partition_method="uniform")
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
              "optimizer": OPTIMIZERS[optimizer], "steps_per_print": 10 ** 6,
              # a schedule whose state matters: the LR still warms up when the run resumes
              "scheduler": {"type": "WarmupLR",
                            "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.05,
                                       "warmup_num_steps": 10}},
              **(extra or {})}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    return engine


def _train(engine, data):
    dp_rank = engine.grid.get_data_parallel_rank()
    return [engine.train_batch(iter(batch[dp_rank])).item() for batch in data]


def _params(engine):
    return {name: p.detach().clone() for name, p in engine.module.named_parameters()}


def _save_then_train(save_dir, stages, optimizer, data, extra=None):
    """Train 2 batches, save, train 2 more: the losses after the save."""
    engine = _engine(stages, optimizer, extra=extra)
    _train(engine, data[:2])
    engine.save_checkpoint(save_dir, tag=TAG)
    losses = _train(engine, data[2:])
    engine.destroy()
    return losses


def _load_then_train(save_dir, stages, optimizer, data, extra=None):
    """A fresh engine (other initial weights) loads the checkpoint and trains 2 batches."""
    engine = _engine(stages, optimizer, seed=BASE_SEED + 100, extra=extra)
    path, client_state = engine.load_checkpoint(save_dir, tag=TAG)
    assert os.path.basename(path) == f"mp_rank_{engine.grid.get_model_parallel_rank():02d}" \
                                      f"_model_states.pt"
    assert engine.global_steps == 2
    losses = _train(engine, data[2:])
    engine.destroy()
    return losses


ASYNC_SAFETENSORS = {"checkpoint": {"checkpoint_engine": {"type": "async",
                                                           "format": "safetensors"}}}


@pytest.mark.parametrize("world,stages,optimizer,zero,extra", [
    (2, 2, "AdamW", 0, None), (4, 2, "SGD", 0, None), (4, 2, "AdamW", 1, None),
    (2, 2, "SGD", 0, ASYNC_SAFETENSORS)])
def test_resume_at_the_same_shape_is_bit_identical(dist_pool, tmp_path, world, stages,
                                                   optimizer, zero, extra):
    data = batches(4, GAS, dp_world=world // stages)
    if zero:
        extra = {**(extra or {}), "zero_optimization": {"stage": zero}}
    first = dist_pool.run(_save_then_train, world_size=world,
                          args=(str(tmp_path), stages, optimizer, data, extra))
    files = sorted(os.listdir(tmp_path / TAG))
    layer_files = [f"layer_{i:02d}-model_states.pt" for i in range(7)]
    assert layer_files == [f for f in files if f.startswith("layer_") and f.endswith(".pt")]
    sidecars = [f for f in files if f.startswith("layer_") and not f.endswith(".pt")]
    # safetensors keeps each file's non-tensor skeleton beside it (<file>.state.json)
    safetensors = extra is ASYNC_SAFETENSORS
    assert sidecars == ([f + ".state.json" for f in layer_files] if safetensors else [])
    assert {f"mp_rank_{s:02d}_model_states.pt" for s in range(stages)} <= set(files)
    assert (tmp_path / "latest").read_text() == TAG
    for stage in range(stages):
        state = load_file(tmp_path / TAG / f"mp_rank_{stage:02d}_model_states.pt")
        assert state["module"] is None and state["pipeline_stages"] == stages
    if zero:
        assert {f"zero_pp_rank_{d}_mp_rank_{s:02d}_optim_states.pt"
                for d in range(world // stages) for s in range(stages)} <= set(files)
    second = dist_pool.run(_load_then_train, world_size=world,
                           args=(str(tmp_path), stages, optimizer, data, extra))
    assert second == first  # exactly: weights, optimizer state, scheduler and counters


def _layer_files_hold_the_weights(save_dir):
    """Every rank's parameters equal what the layer files hold (global layer names)."""
    engine = _engine(2, "AdamW")
    _train(engine, batches(1, GAS, dp_world=1))
    engine.save_checkpoint(save_dir, tag=TAG)
    saved = {}
    for name, p in engine.module.named_parameters():
        layer, key = name.split(".", 1)
        state = torch.load(os.path.join(save_dir, TAG, f"layer_{int(layer):02d}-model_states.pt"),
                           weights_only=True)
        saved[name] = torch.equal(state[key], p.detach())
    engine.destroy()
    return saved


def test_layer_files_hold_each_stages_weights(dist_pool, tmp_path):
    results = dist_pool.run(_layer_files_hold_the_weights, world_size=2, args=(str(tmp_path),))
    assert all(all(r.values()) and r for r in results)
    assert set(results[0]) | set(results[1]) == {f"{i}.{k}" for i in (0, 2, 4, 6)
                                                  for k in ("weight", "bias")}


# ------------------------------------------------------------------ another number of stages
def _eval(engine, data):
    loss = engine.eval_batch(iter(data))
    params = {name: p.detach().clone() for name, p in engine.module.named_parameters()}
    return loss.item(), params


def _save_for_reshape(save_dir, tied):
    engine = _engine(2, "SGD", tied=tied)
    _train(engine, batches(2, GAS, dp_world=1))
    engine.save_checkpoint(save_dir, tag=TAG)
    result = _eval(engine, batches(1, GAS, dp_world=1, seed=11)[0][0])
    engine.destroy()
    return result


def _load_reshaped(save_dir, stages, tied, how):
    engine = _engine(stages, "SGD", seed=BASE_SEED + 100, tied=tied)
    if how == "optimizer":
        try:
            engine.load_checkpoint(save_dir, tag=TAG)
        except ValueError as exc:
            return str(exc)
        finally:
            engine.destroy()
        return None
    kwargs = ({"load_module_only": True} if how == "module_only"
              else {"load_optimizer_states": False})
    engine.load_checkpoint(save_dir, tag=TAG, **kwargs)
    result = _eval(engine, batches(1, GAS, dp_world=1, seed=11)[0][0])  # same data on every dp
    if how == "no_optimizer":
        assert engine.global_steps == 2  # counters and scheduler still restored
    engine.destroy()
    return result


@pytest.mark.parametrize("world,stages,tied,how", [
    (2, 1, False, "module_only"), (4, 4, False, "no_optimizer"), (4, 4, True, "module_only")])
def test_weights_load_at_another_number_of_stages(dist_pool, tmp_path, world, stages, tied, how):
    saved = dist_pool.run(_save_for_reshape, world_size=2, args=(str(tmp_path), tied))
    expected_loss = saved[0][0]
    assert saved[1][0] == expected_loss
    expected = {**saved[0][1], **saved[1][1]}
    loaded = dist_pool.run(_load_reshaped, world_size=world,
                           args=(str(tmp_path), stages, tied, how))
    seen = set()
    for loss, params in loaded:
        assert loss == expected_loss  # identical outputs
        for name, value in params.items():
            assert torch.equal(value, expected[name]), name
            seen.add(name)
    assert seen == set(expected)


def test_optimizer_states_across_pipeline_shapes_are_refused(dist_pool, tmp_path):
    dist_pool.run(_save_for_reshape, world_size=2, args=(str(tmp_path), False))
    messages = dist_pool.run(_load_reshaped, world_size=2,
                             args=(str(tmp_path), 1, False, "optimizer"))
    for message in messages:
        assert message is not None
        assert "saved with 2 pipeline stages" in message and "has 1" in message
        assert "load_optimizer_states=False" in message


# ------------------------------------------------------------------ module_state_dict & co
def _module_state_dict_api(save_dir):
    engine = _engine(2, "AdamW")
    _train(engine, batches(1, GAS, dp_world=1))
    outcome = {}
    try:
        engine.module_state_dict()
    except AssertionError as exc:
        outcome["module_state_dict"] = str(exc)
    try:
        engine.load_module_state_dict(save_dir, custom_load_fn=lambda src, dst: None)
    except AssertionError as exc:
        outcome["custom_load_fn"] = str(exc)
    try:
        engine.load_checkpoint(save_dir, custom_load_fn=lambda src, dst: None)
    except AssertionError as exc:
        outcome["load_checkpoint"] = str(exc)
    engine.module.save_state_dict(save_dir)
    before = _params(engine)
    with torch.no_grad():
        for p in engine.module.parameters():
            p.add_(1.0)
    engine.load_module_state_dict(save_dir)  # a directory: the layer files
    outcome["restored"] = all(torch.equal(p, before[n])
                              for n, p in engine.module.named_parameters())
    with torch.no_grad():
        for p in engine.module.parameters():
            p.add_(1.0)
    engine.load_module_state_dict({"module": dict(before)}, strict=True)  # a real dict
    outcome["restored_from_dict"] = all(torch.equal(p, before[n])
                                        for n, p in engine.module.named_parameters())
    engine.destroy()
    return outcome


def test_module_state_dict_and_load_module_state_dict(dist_pool, tmp_path):
    for outcome in dist_pool.run(_module_state_dict_api, world_size=2, args=(str(tmp_path),)):
        assert "save_checkpoint()" in outcome["module_state_dict"]
        assert outcome["custom_load_fn"] == "custom_load_fn not supported w. pipeline parallelism"
        assert outcome["load_checkpoint"] == outcome["custom_load_fn"]
        assert outcome["restored"] and outcome["restored_from_dict"]


# ------------------------------------------------------------------ zero_to_fp32 over stages
def _zero1_save(save_dir, tied):
    engine = _engine(2, "AdamW", tied=tied, extra={"zero_optimization": {"stage": 1}})
    _train(engine, batches(2, GAS, dp_world=engine.dp_world_size))
    engine.save_checkpoint(save_dir, tag=TAG)
    params = _params(engine)
    engine.destroy()
    return params


@pytest.mark.parametrize("world,tied", [(4, False), (2, True)])
def test_zero_to_fp32_consolidates_every_stage(dist_pool, tmp_path, world, tied):
    from deepspeed.zero.zero_to_fp32 import (convert_zero_checkpoint_to_fp32_state_dict,
                                             get_fp32_state_dict_from_zero_checkpoint)

    results = dist_pool.run(_zero1_save, world_size=world, args=(str(tmp_path), tied))
    expected = {}
    for params in results:
        expected.update(params)
    state = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path))
    assert set(state) == set(expected)
    for name, value in expected.items():
        assert torch.equal(state[name], value), name
    lazy = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path), lazy_mode=True)
    assert all(torch.equal(lazy[n].contiguous(), state[n]) for n in state)
    files = convert_zero_checkpoint_to_fp32_state_dict(str(tmp_path), str(tmp_path / "out"),
                                                       max_shard_size="200B")
    assert len(files) > 2  # several shards and the index, across both stages' files
    merged = {}
    for path in files:
        if path.endswith(".bin"):
            merged.update(torch.load(path, weights_only=True))
    assert set(merged) == set(state)
    assert all(torch.equal(merged[n], state[n]) for n in state)


# ------------------------------------------------------------------ ds_to_universal over stages
MOMENTS = ("exp_avg", "exp_avg_sq")


def _full_state(engine):
    """Whole fp32 weight and Adam moments of every trainable parameter (collective under ZeRO;
    without ZeRO the torch optimizer steps the parameters themselves)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    out = {}
    for name, param in engine.module.named_parameters():
        values = {"fp32": safe_get_full_fp32_param(param).clone()}
        for key in MOMENTS:
            value = safe_get_full_optimizer_state(param, key)
            values[key] = (engine.basic_optimizer.state[param][key] if value is None
                           else value).detach().clone()
        out[name] = values
    return out


def _pipe_save_for_universal(save_dir, zero, tied):
    extra = {"zero_optimization": {"stage": zero}} if zero else None
    engine = _engine(2, "AdamW", tied=tied, extra=extra)
    _train(engine, batches(2, GAS, dp_world=engine.dp_world_size))
    engine.save_checkpoint(save_dir, tag=TAG)
    state = _full_state(engine)
    engine.destroy()
    return state


def _sequential():
    """The pipeline's layers in one ``nn.Sequential``: its state-dict names are the
    PipelineModule's global names (``0.weight``, ``2.bias``, ...)."""
    return torch.nn.Sequential(*[spec.build() for spec in specs()])


def _load_universal_flat(universal_dir, zero):
    import deepspeed

    torch.manual_seed(999)  # other initial weights: everything must come from the checkpoint
    model = _sequential()
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
              "optimizer": OPTIMIZERS["AdamW"], "steps_per_print": 10 ** 6,
              "zero_optimization": {"stage": zero}, "checkpoint": {"load_universal": True}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    engine.load_checkpoint(universal_dir, tag=TAG)
    loaded = _full_state(engine)
    module = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    steps = engine.global_steps
    engine.destroy()
    return loaded, module, steps


def _expected(results):
    expected = {}
    for state in results:
        for name, values in state.items():
            expected.setdefault(name, values)
    return expected


@pytest.mark.parametrize("zero", [0, 1])
def test_ds_to_universal_pipeline_tied_weights_once(dist_pool, tmp_path, zero):
    from deepspeed.checkpoint.ds_to_universal import main
    from deepspeed.checkpoint.universal import load_param_state, read_info

    expected = _expected(dist_pool.run(_pipe_save_for_universal, world_size=2,
                                       args=(str(tmp_path / "pipe"), zero, True)))
    assert "tied_modules.proj.weight" in expected
    assert main(["--input_folder", str(tmp_path / "pipe"), "--output_folder",
                 str(tmp_path / "universal")]) == 0
    out = tmp_path / "universal" / TAG
    info = read_info(out)
    assert sorted(info["group_params"][0]) == sorted(expected)  # the tied weight once
    for name, values in expected.items():
        for key, want in values.items():
            assert torch.equal(load_param_state(out, name, key), want), (name, key)


def _universal_into_pipeline(save_dir):
    import deepspeed
    from deepspeed.pipe import PipelineModule

    from pipe_training import config, mse, specs

    def build(**extra):
        model = PipelineModule(specs(), num_stages=2, loss_fn=mse, partition_method="uniform")
        return deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                    config=config(2, **extra))[0]

    saver = build()
    saver.save_checkpoint(save_dir, tag="t")
    saver.destroy()
    engine = build(checkpoint={"load_universal": True})
    try:
        engine.load_checkpoint(save_dir, tag="t")
    except ValueError as err:
        return str(err)
    finally:
        engine.destroy()
    return None


def test_load_universal_of_a_pipeline_checkpoint_names_the_conversion(dist_pool, tmp_path):
    """A pipeline's own checkpoint loaded with ``load_universal`` (universal checkpoints load
    into a PipelineEngine: tests/plugins/pipe/test_pipe_universal_reshape.py) is refused with
    what it is instead."""
    messages = dist_pool.run(_universal_into_pipeline, world_size=2, args=(str(tmp_path),))
    assert all(m and "is not a universal checkpoint" in m and "load_universal" in m
               for m in messages)


# Last in the file and in this order: the flat loads run on 1, 2 and 3 ranks next to the 4-rank
# saves, and the pool keeps two world sizes warm; after the 2-rank tests above, the 2-rank load
# and both saves find their pools warm, and only the 1- and 3-rank pools start (three starts
# before). Each source (ZeRO stage) is saved and converted once for the loads that read it.
@pytest.fixture(scope="module")
def universal_source(dist_pool, tmp_path_factory):
    from deepspeed.checkpoint.ds_to_universal import convert

    made = {}

    def source(zero):
        if zero not in made:
            root = tmp_path_factory.mktemp(f"pipe_universal_zero{zero}")
            expected = _expected(dist_pool.run(_pipe_save_for_universal, world_size=4,
                                               args=(str(root / "pipe"), zero, False)))
            out = convert(str(root / "pipe"), str(root / "universal"), num_extract_workers=1,
                          num_merge_workers=1)
            made[zero] = root, expected, out
        return made[zero]

    return source


@pytest.mark.parametrize("source_zero,world,zero", [(1, 2, 1), (0, 1, 0), (1, 3, 2)])
def test_ds_to_universal_pipeline_loads_into_a_flat_engine(dist_pool, universal_source,
                                                            source_zero, world, zero):
    from deepspeed.checkpoint.universal import load_param_state, read_info

    root, expected, out = universal_source(source_zero)
    info = read_info(out)
    assert info["source"]["pipeline_stages"] == 2
    assert info["source"]["zero_stage"] == source_zero and info["source"]["dp_world_size"] == 2
    assert len(info["group_params"]) == 1  # the stages' groups merged, as one stage has them
    assert set(info["group_params"][0]) == set(expected)
    assert sorted(info["state_keys"][0]) == sorted(MOMENTS)
    for name, values in expected.items():
        for key, want in values.items():
            assert torch.equal(load_param_state(out, name, key), want), (name, key)
    module = load_file(os.path.join(out, "mp_rank_00_model_states.pt"))["module"]
    assert set(module) == set(expected) and "pipeline_stages" not in load_file(
        os.path.join(out, "mp_rank_00_model_states.pt"))

    for loaded, weights, steps in dist_pool.run(_load_universal_flat, world_size=world,
                                                args=(str(root / "universal"), zero)):
        assert steps == 2 and set(loaded) == set(expected)
        for name, values in expected.items():
            assert torch.equal(weights[name], values["fp32"]), name
            for key, want in values.items():
                assert torch.equal(loaded[name][key], want), (name, key)
