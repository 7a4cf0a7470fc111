"""Loading the plugin catalog (what every ``deepspeed.initialize`` does) imports no feature's
implementation, and the lazily exported names still work as documented imports."""
import json
import subprocess
import sys
import types

import pytest

from deepspeed.utils.lazy_exports import lazy_exports

# one implementation module per plugin whose package used to import it eagerly
IMPLEMENTATIONS = ["deepspeed.pipe.module", "deepspeed.pipe.engine", "deepspeed.onebit.adam",
                   "deepspeed.onebit.compressed", "deepspeed.compression.basic_layer",
                   "deepspeed.compression.moq", "deepspeed.sparse_attention.matmul",
                   "deepspeed.sparse_attention.sparse_self_attention",
                   "deepspeed.inference.engine", "deepspeed.data_efficiency.data_analyzer",
                   "deepspeed.data_efficiency.random_ltd", "deepspeed.zero.stage_1_and_2"]

CATALOG_AND_MODEL = """
import json, sys
import torch
from deepspeed.plugin_manager import PluginCatalog
catalog = PluginCatalog()
catalog.engine_choice(torch.nn.Linear(2, 2))
catalog.wanted_by(torch.nn.Linear(2, 2))
print(json.dumps(sorted(catalog.plugins)))
print(json.dumps([m for m in {wanted} if m in sys.modules]))
"""


def test_catalog_of_every_plugin_imports_no_implementation():
    script = CATALOG_AND_MODEL.format(wanted=IMPLEMENTATIONS)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=120).stdout.splitlines()
    loaded_plugins, imported = json.loads(out[-2]), json.loads(out[-1])
    assert {"pipe", "onebit", "compression", "sparse_attention", "inference",
            "data_efficiency", "zero"} <= set(loaded_plugins)
    assert imported == []


@pytest.mark.parametrize("package, name", [
    ("deepspeed.pipe", "PipelineModule"), ("deepspeed.onebit", "OnebitAdam"),
    ("deepspeed.sparse_attention", "SparseSelfAttention"), ("deepspeed.inference",
                                                             "InferenceEngine"),
    ("deepspeed.data_efficiency", "RandomLayerTokenDrop"), ("deepspeed.comms_logging",
                                                            "CommsLogger"),
    ("deepspeed.zero", "GatheredParameters")])
def test_documented_names_still_import(package, name):
    namespace = {}
    exec(f"from {package} import {name}", namespace)
    assert namespace[name].__name__ == name
    assert name in dir(sys.modules[package])


def test_lazy_exports_loads_on_first_read_and_refuses_unknown_names():
    package = types.ModuleType("lazy_probe_package")
    sys.modules[package.__name__] = package
    try:
        package.__getattr__, package.__dir__ = lazy_exports(package.__name__,
                                                            {"dumps": "json"})
        assert "dumps" not in vars(package)
        assert package.dumps is json.dumps
        assert vars(package)["dumps"] is json.dumps  # kept: the next read is a plain lookup
        assert "dumps" in dir(package)
        with pytest.raises(AttributeError, match="lazy_probe_package.*'loads'"):
            package.loads
    finally:
        del sys.modules[package.__name__]
