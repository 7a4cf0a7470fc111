"""Progressive layer drop and the legacy seqlen curriculum through the engine, on 2 ranks."""
import math
import re

import pytest
import torch
from torch import nn

from deepspeed.data_efficiency import ProgressiveLayerDrop
from deepspeed.testing.distributed import run_distributed


def theta(k, bar=0.5, gamma=0.001):
    return (1 - bar) * math.exp(-gamma * k) + bar


def test_pld_formula():
    pld = ProgressiveLayerDrop(theta=0.5, gamma=0.001)
    assert pld.get_theta() == 1.0
    for k in (1, 10, 1000, 5000):
        pld.update_state(k)
        assert pld.get_theta() == pytest.approx(theta(k), abs=1e-12)
    pld.update_state(1000)
    assert round(pld.get_theta(), 5) == 0.68394


class PLDModel(nn.Module):
    """Skips its second layer with probability 1 - pld_theta, recording the keywords."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)
        self.calls = []

    def forward(self, x, progressive_layer_drop=False, pld_theta=1.0):
        self.calls.append((progressive_layer_drop, pld_theta))
        h = self.a(x)
        if progressive_layer_drop and torch.rand(()) > pld_theta:
            h = h.detach() * 0 + h  # skipped block: identity
        else:
            h = torch.relu(h)
        return self.b(h).pow(2).mean()


def _pld(steps):
    import deepspeed

    model = PLDModel()
    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 6,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
              "progressive_layer_drop": {"enabled": True, "theta": 0.3, "gamma": 0.1}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    thetas = []
    for _ in range(steps):
        thetas.append(engine.get_pld_theta())
        engine.backward(engine(torch.randn(2, 4)))
        engine.step()
    engine.eval()
    engine(torch.randn(2, 4))
    calls = list(model.calls)
    final = engine.get_pld_theta()
    engine.destroy()
    return thetas, calls, final


def test_pld_engine_on_2_ranks():
    steps = 5
    for thetas, calls, final in run_distributed(_pld, world_size=2, args=(steps,)):
        expected = [1.0] + [theta(k, 0.3, 0.1) for k in range(1, steps)]
        assert thetas == pytest.approx(expected, abs=1e-12)
        assert calls[:steps] == [(True, pytest.approx(t, abs=1e-12)) for t in expected]
        assert calls[steps] == (False, 1.0)  # eval: no PLD keywords
        assert final == pytest.approx(theta(steps, 0.3, 0.1), abs=1e-12)


def _initialize_error(model_name, config):
    """In a worker (``initialize`` brings up the distributed backend, which must not stay up in
    the pytest process): the ``(type name, message)`` of the error ``initialize`` raises."""
    import deepspeed

    model = nn.Linear(2, 2) if model_name == "linear" else KeywordModel()
    try:
        deepspeed.initialize(model=model, config=config)
    except Exception as err:  # the test asserts on the type and message
        return type(err).__name__, str(err)
    return None, None


def _error_of(model_name, config):
    return run_distributed(_initialize_error, world_size=1, args=(model_name, config))[0]


def test_pld_refuses_model_without_keywords():
    kind, message = _error_of("linear", {"train_micro_batch_size_per_gpu": 1,
                                         "progressive_layer_drop": {"enabled": True}})
    assert kind == "TypeError" and re.search("pld_theta|progressive_layer_drop", message), \
        (kind, message)


CL = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 2, "max_difficulty": 12,
      "schedule_type": "fixed_linear",
      "schedule_config": {"total_curriculum_step": 5, "difficulty_step": 2}}


def cl_reference(t):
    d = math.floor(min(t / 5, 1) * 10 + 2)
    return min(d - d % 2, 12)


class KeywordModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(1, 1)
        self.seen = []

    def forward(self, x, curriculum_seqlen=None):
        self.seen.append(curriculum_seqlen)
        return self.w(x[:, :curriculum_seqlen, None]).mean()


class PlainModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(1, 1)
        self.seen = []

    def forward(self, x, y=None):
        self.seen.append((x.shape[1], None if y is None else y.shape[1]))
        return self.w(x[..., None]).mean()


def _legacy(kind, ckpt, layout="plugin_states"):
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.testing.checkpoints import write_pre_stateful_layout

    config = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 6,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01}}, "curriculum_learning": CL}

    def build():
        model = KeywordModel() if kind == "keyword" else PlainModel()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
        return engine, model

    engine, model = build()
    for _ in range(4):
        engine.backward(engine(torch.randn(2, 12), y=torch.randn(2, 12)) if kind == "plain"
                        else engine(torch.randn(2, 12)))
        engine.step()
    engine.save_checkpoint(ckpt, tag="t")
    difficulty = engine.curriculum_scheduler_legacy.get_current_difficulty()
    engine.destroy()
    if layout == "pre-stateful" and dist.get_rank() == 0:  # the file as plugins wrote it before
        assert write_pre_stateful_layout(f"{ckpt}/t") == ["ds_data_efficiency"]
    dist.barrier()
    engine2, _ = build()
    engine2.load_checkpoint(ckpt)
    restored = engine2.curriculum_scheduler_legacy.get_current_difficulty()
    engine2.destroy()
    return model.seen, difficulty, restored


@pytest.mark.parametrize("kind,layout", [("keyword", "plugin_states"), ("plain", "plugin_states"),
                                         ("keyword", "pre-stateful")])
def test_legacy_curriculum_on_2_ranks(tmp_path, kind, layout):
    for seen, difficulty, restored in run_distributed(_legacy, world_size=2,
                                                      args=(kind, str(tmp_path / kind), layout)):
        schedule = [cl_reference(t) for t in range(1, 5)]
        if kind == "keyword":
            assert seen == schedule
        else:  # no curriculum_seqlen keyword: the engine truncates the batch itself
            assert seen == [(d, d) for d in schedule]
        assert difficulty == restored == schedule[-1]


def test_legacy_section_errors():
    bad = dict(CL, schedule_type="fixed_root")
    for section, pattern in [(bad, "root_degree"),
                             ({k: v for k, v in CL.items() if k != "max_difficulty"},
                              "max_difficulty")]:
        kind, message = _error_of("keyword", {"train_micro_batch_size_per_gpu": 1,
                                              "curriculum_learning": section})
        assert kind in ("DeepSpeedConfigError", "ValueError", "ValidationError") \
            and re.search(pattern, message), (kind, message)
