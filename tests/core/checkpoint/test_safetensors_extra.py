"""safetensors is an extra, as upstream: without it the safetensors format says how to get it."""
import sys

import pytest

from deepspeed.checkpoint.engines import safetensors_format


def test_missing_safetensors_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import now raises ImportError
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ImportError, match=r"deepspeed\[safetensors\]"):
        safetensors_format.write({"w": None}, "unused.safetensors", lambda path, fn: fn(path))
    with pytest.raises(ImportError, match=r"pip install safetensors"):
        safetensors_format.read("unused.safetensors")
