"""``deepspeed.utils.patching.PatchSet`` on stand-in owners (a class with a base, a module):
exact restore, reference counting, stacking in any restore order, rollback of a failed build."""
import logging
import types

import pytest

from deepspeed.utils import patching
from deepspeed.utils.patching import PatchSet


class _Base:
    def inherited(self):
        return "base"


class _Owner(_Base):
    def own(self):
        return "own"


def _replacing(**values):
    def build(patches):
        for name, value in values.items():
            patches.replace(_Owner, name, value)
    return build


@pytest.fixture
def module():
    namespace = types.ModuleType("stand_in")
    namespace.function = lambda: "original"
    return namespace


def test_restore_puts_back_the_very_object_and_deletes_what_was_not_there():
    own = vars(_Owner)["own"]
    patch_set = PatchSet("test", _replacing(own=lambda self: "new", inherited=lambda self: "new"))
    with patch_set:
        assert _Owner().own() == _Owner().inherited() == "new"
        assert [label for label, _ in patching.live_patches()] == ["test", "test"]
    assert vars(_Owner)["own"] is own
    assert "inherited" not in vars(_Owner)  # inherited again, not a copy on _Owner
    assert patching.live_patches() == []


def test_installs_are_counted_and_built_once(module):
    builds = []

    def build(patches):
        builds.append(1)
        patches.replace(module, "function", lambda: "patched")

    original = module.function
    patch_set = PatchSet("counted", build)
    patch_set.install()
    patch_set.install()
    assert patch_set.users == 2 and len(builds) == 1
    patch_set.restore()
    assert module.function() == "patched"  # one user still needs it
    patch_set.restore()
    assert module.function is original and not patch_set.installed
    patch_set.restore()  # nothing installed: nothing happens
    assert module.function is original


@pytest.mark.parametrize("order", ["last in first out", "first in first out"])
def test_sets_on_one_attribute_stack_and_restore_in_any_order(module, order):
    original = module.function
    first = PatchSet("first", lambda p: p.replace(module, "function", lambda: "first"))
    second = PatchSet("second", lambda p: p.replace(module, "function", lambda: "second"))
    first.install()
    second.install()
    assert module.function() == "second"
    if order == "first in first out":
        first.restore()
        assert module.function() == "second"  # the newest stays visible
        second.restore()
    else:
        second.restore()
        assert module.function() == "first"
        first.restore()
    assert module.function is original and patching.original(module, "function") is original


def test_a_build_that_raises_leaves_nothing_behind(module):
    original, own = module.function, vars(_Owner)["own"]

    def build(patches):
        patches.replace(module, "function", lambda: "patched")
        patches.replace(_Owner, "own", lambda self: "patched")
        raise KeyError("half way")

    patch_set = PatchSet("failing", build)
    with pytest.raises(KeyError):
        patch_set.install()
    assert module.function is original and vars(_Owner)["own"] is own
    assert not patch_set.installed and patching.live_patches() == []


def test_replace_outside_install_is_refused(module):
    with pytest.raises(RuntimeError, match="outside install"):
        PatchSet("idle").replace(module, "function", None)


def test_original_reports_what_was_there_before_any_set(module):
    original = module.function
    with PatchSet("a", lambda p: p.replace(module, "function", lambda: "a")):
        with PatchSet("b", lambda p: p.replace(module, "function", lambda: "b")):
            assert patching.original(module, "function") is original
    assert patching.original(_Owner, "inherited", default="none") == "none"


def test_a_foreign_replacement_on_top_is_dropped_with_a_warning(module, caplog):
    original = module.function
    logger = logging.getLogger("DeepSpeed")  # does not propagate: hand caplog's handler to it
    logger.addHandler(caplog.handler)
    try:
        with PatchSet("ours", lambda p: p.replace(module, "function", lambda: "ours")):
            module.function = lambda: "theirs"
    finally:
        logger.removeHandler(caplog.handler)
    assert module.function is original
    assert "stand_in.function was replaced by someone else" in caplog.text
