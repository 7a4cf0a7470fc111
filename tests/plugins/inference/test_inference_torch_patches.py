"""Torch is itself again after ``empty_init()`` (``deepspeed.inference.torch_patches``): its
``register_parameter`` replacement is gone, by identity against a snapshot taken before the
inference plugin was imported, after the context exits, after an exception inside it, after
nested contexts, and after a checkpoint load into the model it built finishes or fails.

All scenarios run one after another in one fresh rank; each test checks one scenario's result.
"""
from pathlib import Path

import pytest
import torch

from torch_identity import UNPATCHED, Scenarios, run_fresh, unlisted

README = Path(__file__).parents[3] / "plugins" / "inference" / "README.md"


def _model():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _scenarios(directory):
    import os

    scenarios = Scenarios("deepspeed.inference")
    check = scenarios.check

    import deepspeed
    from deepspeed.inference.checkpoint import empty_init

    with empty_init():
        check("inside empty_init")
        model = _model()
    check("empty_init exited", on_meta=all(p.is_meta for p in model.parameters()))

    try:
        with empty_init():
            _model()
            raise KeyError("inside")
    except KeyError:
        pass
    check("exception inside empty_init")

    with empty_init():
        with empty_init():
            inner = _model()
        outer = _model()
    check("nested empty_init exited",
          on_meta=all(p.is_meta for m in (inner, outer) for p in m.parameters()))

    torch.manual_seed(0)
    reference = _model()
    full = os.path.join(directory, "full.pt")
    torch.save(reference.state_dict(), full)
    with empty_init():
        model = _model()
    x = torch.randn(3, 4)
    engine = deepspeed.init_inference(model, dtype=torch.float, checkpoint=full)
    with torch.no_grad():
        matches = torch.equal(engine(x), reference(x))
    check("checkpoint load finished", matches=matches)

    partial = os.path.join(directory, "partial.pt")
    torch.save({k: v for k, v in reference.state_dict().items() if k.startswith("0.")}, partial)
    with empty_init():
        model = _model()
    try:
        deepspeed.init_inference(model, dtype=torch.float, checkpoint=partial)
        failed = False
    except ValueError:
        failed = True
    check("checkpoint load failed", failed=failed)
    return scenarios.results


@pytest.fixture(scope="module")
def results(dist_pool, tmp_path_factory):
    return run_fresh(dist_pool, _scenarios, args=(str(tmp_path_factory.mktemp("patches")),))


@pytest.mark.parametrize("scenario, extra", [
    ("empty_init exited", {"on_meta": True}),
    ("exception inside empty_init", {}),
    ("nested empty_init exited", {"on_meta": True}),
    ("checkpoint load finished", {"matches": True}),
    ("checkpoint load failed", {"failed": True})])
def test_torch_is_unpatched(results, scenario, extra):
    assert results[scenario] == {**UNPATCHED, **extra}


def test_the_check_sees_the_patch_while_it_is_in_place(results):
    inside = results["inside empty_init"]
    assert inside["differences"] == ["torch.nn.Module.register_parameter replaced"]
    assert [label for label, _ in inside["live"]] == [
        "inference.empty_init: nn.Module.register_parameter"]


def test_the_patch_is_listed_in_the_readme_and_the_module_docstring(results):
    from deepspeed.inference import torch_patches

    seen = results["inside empty_init"]["differences"]
    assert unlisted(seen, README.read_text()) == []
    assert unlisted(seen, torch_patches.__doc__) == []
