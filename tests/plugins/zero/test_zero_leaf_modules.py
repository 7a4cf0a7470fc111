"""ZeRO-3 leaf modules (`deepspeed.utils.set_z3_leaf_modules`): a mixture-of-experts block whose
ranks route to different experts trains like the single-process reference once the block is a
leaf (without it, each rank would gather only its own experts and the all-gathers would pair
one rank's expert with another's)."""
import pytest
import torch

from zero_models import full_params

LR = 1e-2
STEPS = 3
MICRO = 4


class Expert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(6, 9)
        self.down = torch.nn.Linear(9, 6)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class MoEBlock(torch.nn.Module):
    """Top-1 routing on the sign of the first feature; only experts with tokens run."""

    def __init__(self):
        super().__init__()
        self.experts = torch.nn.ModuleList([Expert(), Expert()])

    def forward(self, x):
        choice = (x[:, 0] <= 0).long()
        out = torch.zeros_like(x)
        for index, expert in enumerate(self.experts):
            mask = choice == index
            if mask.any():
                out = out.index_put((mask.nonzero().squeeze(1),), expert(x[mask]))
        return out


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(6, 6)
        self.moe = MoEBlock()
        self.head = torch.nn.Linear(6, 2)

    def forward(self, x):
        h = self.inp(x)
        return self.head(h + self.moe(h))


def _model():
    torch.manual_seed(0)
    return Net()


def _data(world):
    """Rank 0's samples all route to expert 0 after ``inp``, rank 1's to expert 1."""
    model = _model()
    g = torch.Generator().manual_seed(5)
    pool = torch.randn(400, 6, generator=g)
    with torch.no_grad():
        first = model.inp(pool)[:, 0]
    by_expert = [pool[first > 0.3], pool[first <= -0.3]]
    per_step = []
    for s in range(STEPS):
        per_step.append([by_expert[r % 2][(s * world + r) * MICRO:(s * world + r + 1) * MICRO]
                         for r in range(world)])
    return per_step


def _loss(model, x):
    return model(x).pow(2).mean()


def _reference(world):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    for batches in _data(world):
        _loss(model, torch.cat(batches)).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _train(leaf_spec):
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.utils import (get_z3_leaf_modules, set_z3_leaf_modules,
                                 set_z3_leaf_modules_by_name)

    model = _model()
    if isinstance(leaf_spec, str) and leaf_spec.startswith("named:"):
        marked = set_z3_leaf_modules_by_name(model, [leaf_spec[len("named:"):]])
    else:
        marked = set_z3_leaf_modules(model, [leaf_spec]) if leaf_spec else []
    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, *_ = deepspeed.initialize(model=model, config=config)
    rank = dist.get_rank()
    for batches in _data(dist.get_world_size()):
        engine.backward(_loss(engine, batches[rank]))
        engine.step()
    return (full_params(engine.module), [type(m).__name__ for m in marked],
            [type(m).__name__ for m in get_z3_leaf_modules(engine.module)])


@pytest.mark.parametrize("leaf_spec", ["MoEBlock", MoEBlock, "named:moe"],
                         ids=["by-class-name", "by-class", "by-module-name"])
def test_uneven_expert_routing_trains_like_the_reference(dist_pool, leaf_spec):
    expected = _reference(2)
    for params, marked, leaves in dist_pool.run(_train, args=(leaf_spec,)):
        assert marked == leaves == ["MoEBlock"]
        for name, want in expected.items():
            torch.testing.assert_close(params[name], want, rtol=0, atol=1e-6, msg=name)


def test_without_the_leaf_mark_uneven_routing_hangs_or_diverges():
    """The failure the leaf mark exists for (so the test above can fail): each rank gathers
    only the experts it routed to, and the collectives no longer pair up. Here that is a
    hang (a private world, killed after 20 s); should it ever return, it must be wrong."""
    from deepspeed.testing.distributed import DistributedTimeoutError, run_distributed

    expected = _reference(2)
    try:
        params = run_distributed(_train, args=(None,), fresh=True, timeout=20)[0][0]
    except DistributedTimeoutError:
        return
    assert any(not torch.allclose(params[n], want, atol=1e-4) for n, want in expected.items())


def test_marking_errors_name_what_was_asked():
    from deepspeed.utils import (get_z3_leaf_modules, set_z3_leaf_modules,
                                 unset_z3_leaf_modules, z3_leaf_module, z3_leaf_parameter)

    model = _model()
    with pytest.raises(ValueError, match="MixtralSparseMoeBlock"):
        set_z3_leaf_modules(model, ["MixtralSparseMoeBlock"])
    with pytest.raises(ValueError, match="non-empty list"):
        set_z3_leaf_modules(model, [])
    set_z3_leaf_modules(model, [MoEBlock])
    assert z3_leaf_module(model.moe) and not z3_leaf_module(model.inp)
    assert z3_leaf_parameter(model.moe.experts[1].down.weight)
    assert not z3_leaf_parameter(model.inp.weight)
    assert unset_z3_leaf_modules(model, [MoEBlock]) == [model.moe]
    assert get_z3_leaf_modules(model) == [] and not z3_leaf_parameter(model.moe.experts[0].up.bias)


def test_marking_by_module_name():
    from deepspeed.utils import (get_z3_leaf_modules, set_z3_leaf_modules_by_name,
                                 z3_leaf_parameter)

    model = _model()
    assert set_z3_leaf_modules_by_name(model, ["moe.experts.1", "moe.experts.0"]) == \
        [model.moe.experts[1], model.moe.experts[0]]
    assert get_z3_leaf_modules(model) == [model.moe.experts[0], model.moe.experts[1]]
    assert z3_leaf_parameter(model.moe.experts[0].up.weight)
    with pytest.raises(ValueError, match=r"no module named \['moe.router'\]"):
        set_z3_leaf_modules_by_name(model, ["moe.router", "inp"])
    assert not z3_leaf_parameter(model.inp.weight)  # nothing marked when a name is missing
    assert set_z3_leaf_modules_by_name(model, ["moe.router", "inp"],
                                       raise_if_not_found=False) == [model.inp]
    set_z3_leaf_modules_by_name(model, "inp", flag=False)
    assert not z3_leaf_parameter(model.inp.weight)
