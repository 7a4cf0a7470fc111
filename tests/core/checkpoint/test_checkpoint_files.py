"""The file-level pieces in one process: atomic writes, weights-only checks, tag names, RNG
capture, and ``deepspeed.checkpoint.utils``."""
import argparse
import os
import random

import numpy as np
import pytest
import torch

from deepspeed.checkpoint import (CheckpointFormatError, atomic_torch_save, atomic_write_text,
                                  ensure_weights_only_loadable, load_file, read_latest)
from deepspeed.checkpoint.layout import (checkpoint_dir_for_load, normalize_tag,
                                         required_file)
from deepspeed.checkpoint.rng import capture_rng_state, restore_rng_state
from deepspeed.checkpoint.utils import clone_tensors_for_torch_save


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "state.pt"
    atomic_torch_save({"v": torch.tensor([1.0])}, path)

    def torn_save(obj, f, *args, **kwargs):
        if hasattr(f, "name"):  # the real file, not the in-memory weights-only check
            f.write(b"torn")
            raise OSError("disk full (simulated)")
        return real_save(obj, f, *args, **kwargs)

    real_save = torch.save
    monkeypatch.setattr(torch, "save", torn_save)
    with pytest.raises(OSError, match="disk full"):
        atomic_torch_save({"v": torch.tensor([2.0])}, path)
    assert os.listdir(tmp_path) == ["state.pt"]
    assert torch.equal(load_file(path)["v"], torch.tensor([1.0]))


def test_text_write_replaces_atomically(tmp_path):
    atomic_write_text(tmp_path / "latest", "global_step1")
    atomic_write_text(tmp_path / "latest", "global_step2")
    assert os.listdir(tmp_path) == ["latest"]
    assert read_latest(tmp_path) == "global_step2"
    (tmp_path / "latest").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        read_latest(tmp_path)


def test_unsafe_objects_are_refused_before_writing(tmp_path):
    with pytest.raises(CheckpointFormatError) as exc:
        atomic_torch_save({"ok": torch.ones(2), "rng": {"numpy": np.zeros(3)}}, tmp_path / "a.pt")
    assert "state['rng']['numpy']" in str(exc.value) and "numpy.ndarray" in str(exc.value)
    assert os.listdir(tmp_path) == []
    # what DeepSpeed state dicts hold is fine
    ensure_weights_only_loadable({"shapes": [torch.Size([2, 3])], "dtype": torch.bfloat16,
                                  "betas": (0.9, 0.999), "none": None, 3: "int key"})


def test_loading_a_pickled_object_names_the_file(tmp_path):
    path = tmp_path / "foreign.pt"
    torch.save({"args": argparse.Namespace(lr=1)}, path)  # written by other code
    with pytest.raises(CheckpointFormatError, match="foreign.pt.*argparse.Namespace"):
        load_file(path)


@pytest.mark.parametrize("tag", ["", " ", ".", "..", "a/b", "latest", ".x.tmp-1-2", None, 1.5,
                                 True])
def test_invalid_tags(tag):
    with pytest.raises((ValueError, TypeError)):
        normalize_tag(tag)


def test_valid_tags():
    assert normalize_tag(7) == "7"
    assert normalize_tag("global_step14") == "global_step14"


def test_missing_paths_name_what_exists(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        checkpoint_dir_for_load(tmp_path / "none", "t")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "other.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"holds: \['other.pt'\]"):
        required_file(str(tmp_path / "t"), "mp_rank_00_model_states.pt")


def _draw():
    return random.random(), float(np.random.rand()), torch.rand(2)


def test_rng_round_trip_through_a_weights_only_file(tmp_path):
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    _draw()
    atomic_torch_save(capture_rng_state(), tmp_path / "rng.pt")
    expected = _draw()
    _draw()
    restore_rng_state(load_file(tmp_path / "rng.pt"))
    got = _draw()
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


def test_clone_tensors_for_torch_save(tmp_path):
    flat = torch.arange(1000.0, requires_grad=True)
    view = flat[:4]
    item = {"a": [view, (view * 2,)], "b": 3}
    cloned = clone_tensors_for_torch_save(item)
    assert type(cloned) is dict and cloned["b"] == 3
    assert isinstance(cloned["a"], list) and isinstance(cloned["a"][1], tuple)
    assert torch.equal(cloned["a"][0], view) and not cloned["a"][0].requires_grad
    assert cloned["a"][0].untyped_storage().data_ptr() != flat.untyped_storage().data_ptr()
    torch.save(view, tmp_path / "view.pt")
    torch.save(cloned["a"][0], tmp_path / "clone.pt")
    assert os.path.getsize(tmp_path / "view.pt") > os.path.getsize(tmp_path / "clone.pt") + 3000


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_accelerator_rng_round_trip(tmp_path, monkeypatch):
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator
    from deepspeed.checkpoint import rng

    monkeypatch.setattr(rng, "get_accelerator", CUDA_Accelerator)
    atomic_torch_save(capture_rng_state(), tmp_path / "rng.pt")
    state = load_file(tmp_path / "rng.pt")
    assert "accelerator" in state
    expected = torch.rand(3, device="cuda")
    restore_rng_state(state)
    assert torch.equal(torch.rand(3, device="cuda"), expected)
