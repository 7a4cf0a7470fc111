"""setup.py's UPSTREAM_PATHS: a plugin ships shims for upstream import paths inside core
packages, mapped by the packaging (editable install and wheel alike), never imported by core."""
import importlib
import os
import runpy
from pathlib import Path
from unittest import mock

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[2]


def _setup_namespace():
    env = {k: v for k, v in os.environ.items() if not k.startswith("DS_BUILD_")}
    with mock.patch.object(setuptools, "setup", lambda **kwargs: None), \
            mock.patch.dict(os.environ, env, clear=True):
        return runpy.run_path(str(ROOT / "setup.py"), run_name="setup_for_upstream_paths")


def test_zero_shims_are_mapped_onto_upstream_names():
    mapping = _setup_namespace()["package_map"]()
    shims = os.path.join("plugins", "zero", "upstream_paths")
    assert mapping["deepspeed.utils.zero_to_fp32"] == os.path.join(shims, "utils", "zero_to_fp32")
    assert mapping["deepspeed.checkpoint.ds_to_universal"] == os.path.join(
        shims, "checkpoint", "ds_to_universal")
    assert mapping["deepspeed.nvme"] == os.path.join(shims, "nvme")
    # the folders above a shim keep their owners, and the shim folder has no name of its own
    assert mapping["deepspeed.utils"] == os.path.join("core", "utils")
    assert mapping["deepspeed.checkpoint"] == os.path.join("core", "checkpoint")
    # (other plugins ship shims of their own, e.g. deepspeed.runtime.progressive_layer_drop,
    # deepspeed.ops.sparse_attention, deepspeed.runtime.fp16.onebit)
    assert not [name for name, path in mapping.items()
                if path.startswith(shims) and name != "deepspeed.nvme"
                and not name.startswith(("deepspeed.utils.", "deepspeed.checkpoint."))]


@pytest.mark.parametrize("name", ["deepspeed.utils.zero_to_fp32",
                                  "deepspeed.checkpoint.ds_to_universal", "deepspeed.nvme"])
def test_installed_shim_is_the_plugin_folder(name):
    module = importlib.import_module(name)
    assert Path(module.__file__).parent == ROOT / _setup_namespace()["package_map"]()[name]


def test_a_shim_may_not_replace_a_core_package_or_module():
    check = _setup_namespace()["_check_upstream_shims"]
    mapping = {"deepspeed.utils": os.path.join("core", "utils")}
    with pytest.raises(RuntimeError, match="core/utils/logging.py"):
        check(mapping, {"deepspeed.utils.logging": "plugins/x/upstream_paths/utils/logging"})
    with pytest.raises(RuntimeError, match="already is"):
        check(mapping, {"deepspeed.utils": "plugins/x/upstream_paths/utils"})
    check(mapping, {"deepspeed.utils.new_name": "plugins/x/upstream_paths/utils/new_name"})
