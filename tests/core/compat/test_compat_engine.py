"""The engine as code written against upstream uses it: ``global_rank``, attributes forwarded to
the wrapped module, and ``step()`` refused inside ``no_sync()`` on every rank. One 2-rank run
(fp16, the configuration in which the unrefused pattern hung) serves every assertion."""
import pytest
import torch


class Generator(torch.nn.Module):
    """A model with its own methods and attributes, some named like engine members."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.tag = "tiny"
        self.config = "the model's own config"

    def forward(self, x):
        return self.proj(x)

    def generate(self, x, steps=2):
        for _ in range(steps):
            x = self.proj(x)
        return x

    def step(self):
        return "the model's step"


def _engine_members_and_no_sync():
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.accelerator import get_accelerator

    engine, *_ = deepspeed.initialize(model=Generator(), config={
        "train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True, "initial_scale_power": 4},
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    out = {"global_rank": engine.global_rank, "rank": dist.get_rank(),
           "fits": dist.get_world_size() <= get_accelerator().device_count()}
    x = torch.ones(2, 4, dtype=torch.float16)
    with torch.no_grad():
        out["generate"] = torch.equal(engine.generate(x, steps=3), engine.module.generate(x, steps=3))
    out["tag"] = engine.tag
    out["config_is_engines"] = type(engine.config).__name__  # not the model's string
    out["step_is_engines"] = engine.step.__func__ is type(engine).step
    out["proj_is_module_child"] = engine.proj is engine.module.proj
    try:
        engine.no_such_member
    except AttributeError as exc:
        out["missing"] = str(exc)

    records = []
    dist.add_comm_observer(records.append)
    try:
        with engine.no_sync():
            engine.backward(engine(x).float().sum())
            before = list(engine.module.parameters())[0].detach().clone()
            try:
                engine.step()
            except RuntimeError as exc:
                out["step_error"] = str(exc)
            out["collectives_in_no_sync"] = [r.op for r in records]
        out["unchanged"] = torch.equal(before, list(engine.module.parameters())[0])
        # the documented way on: the last backward outside no_sync reduces, then step
        engine.backward(engine(x).float().sum())
        engine.step()
    finally:
        dist.remove_comm_observer(records.append)
    out["steps"] = engine.global_steps
    return out


def test_engine_members_forwarding_and_no_sync_step(dist_pool):
    results = dist_pool.run(_engine_members_and_no_sync)
    for out in results:
        assert out["global_rank"] == out["rank"] and out["fits"]
        assert out["generate"] and out["tag"] == "tiny" and out["proj_is_module_child"]
        assert out["config_is_engines"] == "DeepSpeedConfig" and out["step_is_engines"]
        assert "no attribute 'no_such_member'" in out["missing"] and "Generator" in out["missing"]
        assert "illegal inside no_sync" in out["step_error"]
        assert "after leaving no_sync()" in out["step_error"]
        assert out["collectives_in_no_sync"] == []  # each rank raised on its own
        assert out["unchanged"] and out["steps"] == 1


def test_forwarding_does_not_hide_plugin_attribute_clashes():
    """A plugin attribute is checked against the engine's own members only: a model attribute
    of the same name is no clash (the engine's member wins on the engine)."""
    from deepspeed.engine import DeepSpeedEngine, _owns_attribute

    engine = DeepSpeedEngine.__new__(DeepSpeedEngine)
    torch.nn.Module.__init__(engine)
    engine.module = Generator()
    assert engine.tag == "tiny"
    assert not _owns_attribute(engine, "tag") and _owns_attribute(engine, "module")
    assert _owns_attribute(engine, "step")
    with pytest.raises(AttributeError, match="Generator"):
        engine.nothing_here
