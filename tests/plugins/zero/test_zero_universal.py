"""Universal checkpoints: ZeRO checkpoint -> ds_to_universal -> resume on another topology.

The source is a 2-rank ZeRO-2 run after 2 steps; it is resumed with ``load_universal`` on
1 rank / stage 1, 3 ranks / stage 3 and 2 ranks / stage 2. Right after loading, the fp32
masters and Adam moments must equal the pre-save consolidated values exactly, and 2 more steps
must match single-process AdamW over the same global batches.
"""
import os
import subprocess
import sys

import pytest
import torch

from zero_models import ds_config, make_model, param_groups, reference_phases, train

GAS = 2
TAG = "global_step2"
STATE_KEYS = ("exp_avg", "exp_avg_sq")
ZERO3 = {"stage3_param_persistence_threshold": 0}


def _engine(stage, zero, load_universal=False, scrambled=False):
    import deepspeed

    torch.manual_seed(123)
    model = make_model()
    if scrambled:  # everything must then come from the checkpoint
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
    config = ds_config(stage, GAS, **zero)
    if load_universal:
        config["checkpoint"] = {"load_universal": True}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                      config=config)
    return engine


def _consolidated(engine):
    """Whole fp32 masters and moments of every trainable parameter (collective)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    out = {}
    for name, param in engine.module.named_parameters():
        if param.requires_grad:
            out[name] = {"fp32": safe_get_full_fp32_param(param).clone()}
            for key in STATE_KEYS:
                out[name][key] = safe_get_full_optimizer_state(param, key).clone()
    return out


def _save(stage, save_dir, zero):
    engine = _engine(stage, zero)
    train(engine, 2, GAS)
    before = _consolidated(engine)
    engine.save_checkpoint(save_dir, tag=TAG)
    return before


def _resume(stage, universal_dir, zero):
    engine = _engine(stage, zero, load_universal=True, scrambled=True)
    engine.load_checkpoint(universal_dir, tag=TAG)
    assert engine.global_steps == 2
    loaded = _consolidated(engine)
    return loaded, train(engine, 2, GAS, first_step=2)


def _load_error(stage, folder, zero, load_universal):
    engine = _engine(stage, zero, load_universal=load_universal)
    try:
        engine.load_checkpoint(folder, tag=TAG)
    except (RuntimeError, ValueError) as err:
        return str(err)
    return None


def _convert(src, dst, workers):
    from deepspeed.checkpoint.ds_to_universal import convert

    return convert(src, dst, num_extract_workers=workers, num_merge_workers=workers)


def _files(root):
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def _assert_exact(loaded, before):
    assert set(loaded) == set(before)
    for name, values in before.items():
        for key, want in values.items():
            assert torch.equal(loaded[name][key], want), (name, key)


def _assert_params(results, expected):
    for _, params in results:
        for name, want in expected.items():
            torch.testing.assert_close(params[name], want, rtol=0, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def stage2_source(dist_pool, tmp_path_factory):
    """A 2-rank ZeRO-2 checkpoint, its consolidated values and its universal conversion."""
    root = tmp_path_factory.mktemp("universal")
    before = dist_pool.run(_save, world_size=2, args=(2, str(root / "zero"), {}))[0]
    _convert(str(root / "zero"), str(root / "universal"), 1)
    return root, before


def test_conversion_layout_and_worker_count_independence(stage2_source):
    from deepspeed.checkpoint import load_file
    from deepspeed.checkpoint.universal import load_param_state, read_info

    root, before = stage2_source
    out = root / "universal"
    assert (out / "latest_universal").read_text() == TAG
    info = read_info(out / TAG)
    assert info["source"] == {"zero_stage": 2, "dp_world_size": 2,
                              "ds_version": info["source"]["ds_version"]}
    assert [sorted(g) for g in info["group_params"]] == [
        ["a.bias", "a.weight", "unused.bias", "unused.weight"], ["b.bias", "b.weight"]]
    assert info["optimizer_scalars"] == [{"step": 2}, {"step": 2}]
    assert [g["weight_decay"] for g in info["param_groups"]] == [0.0, 0.1]
    assert info["state_keys"] == [sorted(STATE_KEYS)] * 2
    for name, values in before.items():
        for key, want in values.items():
            assert torch.equal(load_param_state(out / TAG, name, key), want), (name, key)
    frozen = make_model().frozen
    assert torch.equal(load_param_state(out / TAG, "frozen.weight"), frozen.weight)
    module = load_file(out / TAG / "mp_rank_00_model_states.pt")["module"]
    assert torch.equal(module["a.weight"], before["a.weight"]["fp32"])
    assert not (out / "tmp").exists()

    # the same conversion through the command line with 2 workers per phase: identical bytes
    cli = subprocess.run(
        [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
         str(root / "zero"), "--output_folder", str(root / "universal2"),
         "--num_extract_workers", "2", "--num_merge_workers", "2", "--keep_temp_folder"],
        capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert (root / "universal2" / "tmp").is_dir()
    one, two = _files(out / TAG), _files(root / "universal2" / TAG)
    assert sorted(one) == sorted(two)
    for name in one:
        assert one[name] == two[name], name


@pytest.mark.parametrize("world,stage", [(1, 1), (3, 3), (2, 2)])
def test_resume_on_another_topology(dist_pool, stage2_source, world, stage):
    root, before = stage2_source
    zero = ZERO3 if stage == 3 else {}
    results = dist_pool.run(_resume, world_size=world,
                            args=(stage, str(root / "universal"), zero))
    for loaded, _ in results:
        _assert_exact(loaded, before)
    _assert_params(results, reference_phases([(2, 2), (2, world)], GAS))


def _assert_frozen_shapes_recorded(checkpoint_dir):
    """The converter re-assembles ZeRO-3 frozen shards from the full shapes the plugin records."""
    from deepspeed.checkpoint import load_file

    state = load_file(os.path.join(checkpoint_dir, "mp_rank_00_model_states.pt"))
    full = dict(make_model().named_parameters())
    assert {n: tuple(s) for n, s in state["frozen_param_shapes"].items()} == \
        {n: tuple(full[n].shape) for n in state["frozen_param_shapes"]}


def test_stage3_source_resumes_at_stage2(dist_pool, tmp_path):
    before = dist_pool.run(_save, world_size=3, args=(3, str(tmp_path / "zero"), ZERO3))[0]
    _assert_frozen_shapes_recorded(str(tmp_path / "zero" / TAG))
    _convert(str(tmp_path / "zero"), str(tmp_path / "universal"), 2)
    results = dist_pool.run(_resume, world_size=2, args=(2, str(tmp_path / "universal"), {}))
    for loaded, _ in results:
        _assert_exact(loaded, before)
    _assert_params(results, reference_phases([(2, 3), (2, 2)], GAS))


def test_wrong_folder_kinds_are_refused_clearly(dist_pool, stage2_source):
    root, _ = stage2_source
    not_universal, needs_flag = dist_pool.run(_load_error, world_size=1,
                                              args=(2, str(root / "zero"), {}, True))[0], \
        dist_pool.run(_load_error, world_size=1, args=(2, str(root / "universal"), {}, False))[0]
    assert "not a universal checkpoint" in not_universal and "ds_to_universal" in not_universal
    assert "load_universal" in needs_flag


def test_progress_bars_on_a_terminal_only(stage2_source, tmp_path, monkeypatch):
    """One bar per phase on a terminal (stderr a TTY); nothing in a log or a pipe."""
    import io

    from deepspeed.checkpoint.ds_to_universal import convert

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    root, _ = stage2_source
    for stream, drawn in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        convert(str(root / "zero"), str(tmp_path / f"out_{drawn}"), num_extract_workers=1,
                num_merge_workers=1)
        text = stream.getvalue()
        assert ("extracting rank files: 100%" in text and "merging parameters: 100%" in text
                and "2/2" in text) == drawn, text
        assert drawn or text == ""


def test_cli_reports_bad_input(tmp_path, capsys):
    from deepspeed.checkpoint.ds_to_universal import main

    assert main(["--input_folder", str(tmp_path), "--output_folder",
                 str(tmp_path / "out")]) == 1
    assert "neither a checkpoint tag folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--input_folder", str(tmp_path), "--output_folder", str(tmp_path / "o"),
              "--num_merge_workers", "0"])


def test_missing_param_shapes_need_inject_missing_state(stage2_source, tmp_path):
    import shutil

    from deepspeed.checkpoint import CheckpointFormatError, atomic_torch_save, load_file
    from deepspeed.checkpoint.ds_to_universal import convert

    root, _ = stage2_source
    source = tmp_path / TAG
    shutil.copytree(root / "zero" / TAG, source)
    state = load_file(source / "mp_rank_00_model_states.pt")
    del state["param_shapes"]
    atomic_torch_save(state, source / "mp_rank_00_model_states.pt")
    with pytest.raises(CheckpointFormatError, match="--inject_missing_state"):
        convert(source, tmp_path / "out", num_extract_workers=1, num_merge_workers=1)
    out = convert(source, tmp_path / "out", num_extract_workers=1, num_merge_workers=1,
                  inject_missing_state=True)
    want = _files(root / "universal" / TAG)
    got = _files(out)
    assert sorted(got) == sorted(want)
    for name in want:
        if name.startswith("zero"):
            assert got[name] == want[name], name


def _resume_without_zero(universal_dir):
    """Stage 0: the core puts the whole tensors into the torch-side optimizer itself."""
    engine = _engine(0, {}, load_universal=True, scrambled=True)
    engine.load_checkpoint(universal_dir, tag=TAG)
    loaded = {}
    for name, param in engine.module.named_parameters():
        if param.requires_grad:
            state = engine.basic_optimizer.state[param]
            loaded[name] = {"fp32": param.detach().clone(),
                            **{key: state[key].clone() for key in STATE_KEYS}}
    return loaded, train(engine, 2, GAS, first_step=2)


def test_resume_without_zero(dist_pool, stage2_source):
    root, before = stage2_source
    results = dist_pool.run(_resume_without_zero, world_size=1, args=(str(root / "universal"),))
    for loaded, _ in results:
        _assert_exact(loaded, before)
    _assert_params(results, reference_phases([(2, 2), (2, 1)], GAS))
