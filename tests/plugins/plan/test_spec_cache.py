"""A preset is traced once per machine; later plans read its description from the cache, which
is keyed by everything the figures depend on and never trusted when it does not read back."""
import json

import pytest

from deepspeed.plan import model_spec
from deepspeed.plan.spec_cache import CACHE_ENV, cache_dir


def _refuse_to_trace(*args, **kwargs):
    raise AssertionError("traced again although the description was cached")


def test_second_description_comes_from_the_cache(monkeypatch):
    first = model_spec.from_transformers("tiny-llama", seq_len=32)
    files = list(cache_dir().glob("*.json"))
    assert len(files) == 1
    monkeypatch.setattr(model_spec, "_trace_transformers", _refuse_to_trace)
    assert model_spec.from_transformers("tiny-llama", seq_len=32) == first
    with pytest.raises(AssertionError, match="traced again"):  # another sequence length
        model_spec.from_transformers("tiny-llama", seq_len=64)


def test_a_dict_with_other_values_is_another_entry():
    tiny = dict(model_spec.PRESETS["tiny-llama"])
    model_spec.from_transformers(tiny, seq_len=32)
    wider = model_spec.from_transformers(dict(tiny, intermediate_size=256), seq_len=32)
    assert len(list(cache_dir().glob("*.json"))) == 2
    assert wider.total_params > model_spec.from_transformers(tiny, seq_len=32).total_params


def test_a_damaged_file_is_described_again_and_rewritten(monkeypatch):
    first = model_spec.from_transformers("tiny-llama", seq_len=32)
    (path,) = cache_dir().glob("*.json")
    path.write_text(json.dumps({"name": "tiny-llama", "total_params": 1}))  # fields missing
    assert model_spec.from_transformers("tiny-llama", seq_len=32) == first
    assert json.loads(path.read_text())["total_params"] == first.total_params


def test_zero_switches_the_cache_off(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, "0")
    assert cache_dir() is None
    model_spec.from_transformers("tiny-llama", seq_len=32)
    assert not list(tmp_path.rglob("*.json"))
