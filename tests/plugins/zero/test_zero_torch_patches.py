"""Torch is itself again after ZeRO is done with it: every attribute ZeRO patches
(``deepspeed.zero.torch_patches``) is the very object it was before ZeRO was imported, after
``engine.destroy()``, after ``zero.Init`` exits with no engine, after nested, overlapping and
re-entered ``Init`` contexts, after an exception inside an ``Init`` and one while it installs,
and after an engine is garbage-collected without ``destroy()``.

All scenarios run one after another in one fresh rank (the first thing it does is take the
snapshot, before ``deepspeed.zero`` is imported); each test below checks one scenario's result.
"""
from pathlib import Path

import pytest
import torch

from torch_identity import UNPATCHED, Scenarios, run_fresh, unlisted

README = Path(__file__).parents[3] / "plugins" / "zero" / "README.md"

MICRO = 2


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(9, 9)
        self.register_buffer("scale", torch.ones(9))

    def forward(self, x):
        return torch.tanh(self.fc(x)) * self.scale


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(_Block(), torch.nn.Linear(9, 3))


def _config():
    return {"train_micro_batch_size_per_gpu": MICRO,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}


def _train_one_step(engine):
    engine.backward(engine(torch.randn(MICRO, 9)).pow(2).mean())
    engine.step()


def _scenarios():
    import gc

    scenarios = Scenarios("deepspeed.zero")
    check, results = scenarios.check, scenarios.results

    import deepspeed
    from deepspeed.zero import partition_parameters as pp

    # the check sees patches while they are in place (else every test below proves nothing)
    with deepspeed.zero.Init(dtype=torch.float16):
        check("inside Init")
        inside_dtype = torch.zeros(1).dtype
    check("Init exited, no engine")
    results["factories patched inside Init"] = inside_dtype == torch.float16

    with deepspeed.zero.Init(dtype=torch.float16):
        with deepspeed.zero.Init(dtype=torch.bfloat16):
            _model()
            inner_dtype = torch.zeros(1).dtype
        outer_dtype = torch.zeros(1).dtype
        _model()
    check("nested Init exited")
    results["nested dtypes"] = (str(inner_dtype), str(outer_dtype))

    outer, inner = deepspeed.zero.Init(dtype=torch.float16), deepspeed.zero.Init()
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # the outer exits first
    _model()
    inner.__exit__(None, None, None)
    check("overlapping Init exited out of order")

    init = deepspeed.zero.Init()
    with init:
        with init:
            _model()
        _model()
    check("re-entered Init exited")

    try:
        with deepspeed.zero.Init(dtype=torch.float16):
            _model()
            raise KeyError("inside")
    except KeyError:
        pass
    check("exception inside Init")

    def failing_wrapper(fn, dtype, target_device=None):
        raise KeyError("while installing")

    swapped = pp.zero_wrapper_for_fp_tensor_constructor
    pp.zero_wrapper_for_fp_tensor_constructor = failing_wrapper
    try:
        with deepspeed.zero.Init(dtype=torch.float16):
            pass
    except KeyError:
        pass
    finally:
        pp.zero_wrapper_for_fp_tensor_constructor = swapped
    check("exception while Init installs")

    with deepspeed.zero.Init():
        model = _model()
    engine, *_ = deepspeed.initialize(model=model, config=_config())
    _train_one_step(engine)
    check("engine live")
    with deepspeed.zero.Init():  # an Init while an engine lives: only the Init's patches go
        _model()
    check("Init exited, engine live")
    _train_one_step(engine)
    engine.destroy()
    check("engine destroyed")

    engine, *_ = deepspeed.initialize(model=_model(), config=_config())
    _train_one_step(engine)
    del engine
    gc.collect()
    check("engine garbage-collected without destroy")

    model = _model()
    engine, *_ = deepspeed.initialize(model=model, config=_config())
    _train_one_step(engine)
    del engine
    gc.collect()
    check("engine garbage-collected without destroy, model kept")
    results["hooks left on the kept model"] = sum(
        len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    return results


@pytest.fixture(scope="module")
def results(dist_pool):
    return run_fresh(dist_pool, _scenarios)


RESTORED = ["Init exited, no engine", "nested Init exited", "overlapping Init exited out of order",
            "re-entered Init exited", "exception inside Init", "exception while Init installs",
            "engine destroyed", "engine garbage-collected without destroy",
            "engine garbage-collected without destroy, model kept"]


@pytest.mark.parametrize("scenario", RESTORED)
def test_torch_is_unpatched(results, scenario):
    assert results[scenario] == UNPATCHED


def test_the_check_sees_patches_while_they_are_in_place(results):
    inside = results["inside Init"]["differences"]
    assert "torch.zeros replaced" in inside and "torch.nn.Module.__init__ replaced" in inside
    assert "torch.nn.Module.__init_subclass__ added" in inside
    assert results["factories patched inside Init"]
    assert results["engine live"]["differences"] == ["torch.nn.Module.__getattr__ replaced"]
    assert results["Init exited, engine live"] == results["engine live"]


def test_nested_init_uses_the_inner_dtype_then_the_outer_one(results):
    assert results["nested dtypes"] == ("torch.bfloat16", "torch.float16")


def test_a_collected_engine_leaves_no_hooks_on_a_model_the_user_kept(results):
    assert results["hooks left on the kept model"] == 0


def test_every_patch_seen_is_listed_in_the_readme_and_the_module_docstring(results):
    from deepspeed.zero import torch_patches

    seen = results["inside Init"]["differences"] + results["engine live"]["differences"]
    assert unlisted(seen, README.read_text()) == []
    assert unlisted(seen, torch_patches.__doc__) == []
