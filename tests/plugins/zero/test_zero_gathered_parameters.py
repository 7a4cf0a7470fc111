"""``deepspeed.zero.GatheredParameters`` and external parameters under ZeRO-3 on 2 and 3 gloo
ranks, against plain-PyTorch references."""
import pytest
import torch
import torch.nn.functional as F

from zero_models import LR, MICRO, make_data, make_model, micro_batch, param_groups

ARANGE = torch.arange(13 * 7, dtype=torch.float32).view(13, 7) / 100


def _config(persist=0):
    return {"train_micro_batch_size_per_gpu": MICRO,
            "optimizer": {"type": "AdamW", "params": {"lr": LR}},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": persist}}


def _engine(model, persist=0, groups=None):
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=groups if groups is not None else param_groups(model),
        config=_config(persist))
    return engine


def _whole(param):
    """A copy of the full parameter, leaving it as it was (gathered or not)."""
    was_whole = param.data.numel() == param.ds_numel
    if not was_whole:
        param.all_gather()
    copy = param.detach().clone()
    if not was_whole:
        param.partition()
    return copy


def _train_step(engine, x, y, step):
    from deepspeed import comm as dist

    xb, yb = micro_batch(x, y, step, 0, dist.get_rank(), 1, dist.get_world_size())
    engine.backward(F.mse_loss(engine(xb), yb))
    engine.step()


def _net_reference(world, steps, edit=None):
    model = make_model()
    if edit is not None:
        with torch.no_grad():
            edit(model)
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    x, y = make_data(steps, 1, world)
    size = MICRO * world
    for s in range(steps):
        F.mse_loss(model(x[s * size:(s + 1) * size]), y[s * size:(s + 1) * size]).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# ---------------------------------------------------------------------- modifier_rank
def _run_modifier(persist):
    import deepspeed
    from deepspeed import comm as dist

    engine = _engine(make_model(), persist)
    weight = engine.module.a.weight
    rank = dist.get_rank()
    with deepspeed.zero.GatheredParameters(weight, modifier_rank=0):
        inside = tuple(weight.shape)
        with torch.no_grad():  # only rank 0's edit counts
            weight.copy_(ARANGE if rank == 0 else torch.full((13, 7), -5.0))
    after_exit = _whole(weight)
    released = weight.data.numel() == 0
    x, y = make_data(2, 1, dist.get_world_size())
    _train_step(engine, x, y, 0)
    _train_step(engine, x, y, 1)
    trained = {n: _whole(p) for n, p in engine.module.named_parameters()}
    return inside, after_exit, released, trained


@pytest.mark.parametrize("world", [2, 3])
def test_modifier_rank_broadcasts_and_training_uses_it(dist_pool, world):
    results = dist_pool.run(_run_modifier, world_size=world, args=(0,))
    expected = _net_reference(world, 2, edit=lambda m: m.a.weight.copy_(ARANGE))
    for inside, after_exit, released, trained in results:
        assert inside == (13, 7)
        torch.testing.assert_close(after_exit, ARANGE, rtol=0, atol=0)
        assert released
        for name, want in expected.items():
            torch.testing.assert_close(trained[name], want, rtol=0, atol=1e-6, msg=name)


def test_modifier_rank_on_persistent_parameters(dist_pool):
    # every parameter stays whole (threshold above every size): the edit must still reach the
    # shards and the fp32 master, and the parameter stays whole with the new values
    results = dist_pool.run(_run_modifier, world_size=2, args=(10**6,))
    expected = _net_reference(2, 2, edit=lambda m: m.a.weight.copy_(ARANGE))
    for _, after_exit, released, trained in results:
        torch.testing.assert_close(after_exit, ARANGE, rtol=0, atol=0)
        assert not released
        for name, want in expected.items():
            torch.testing.assert_close(trained[name], want, rtol=0, atol=1e-6, msg=name)


# ---------------------------------------------------------------------- discard / disabled
def _run_discard(persist):
    import deepspeed

    engine = _engine(make_model(), persist)
    model = engine.module
    before = {n: _whole(p) for n, p in model.named_parameters()}
    with deepspeed.zero.GatheredParameters(model.parameters()) as params:  # a generator
        shapes = [tuple(p.shape) for p in params]
        with torch.no_grad():
            for param in params:
                param.fill_(7.0)
    after = {n: _whole(p) for n, p in model.named_parameters()}
    with deepspeed.zero.GatheredParameters(model.a.weight, modifier_rank=0, enabled=False):
        disabled_numel = model.a.weight.data.numel()
    return shapes, before, after, disabled_numel, model.a.weight.ds_persist


@pytest.mark.parametrize("persist", [0, 10**6], ids=["sharded", "persistent"])
def test_without_modifier_rank_edits_are_discarded(dist_pool, persist):
    for shapes, before, after, disabled_numel, persistent in dist_pool.run(
            _run_discard, world_size=2, args=(persist,)):
        assert sorted(shapes) == sorted(tuple(w.shape) for w in before.values())
        for name, want in before.items():
            torch.testing.assert_close(after[name], want, rtol=0, atol=0, msg=name)
        assert persistent == bool(persist)
        assert disabled_numel == (13 * 7 if persist else 0)  # enabled=False gathers nothing


def test_non_zero_parameters_are_ignored():
    from deepspeed.zero import GatheredParameters

    layer = torch.nn.Linear(3, 2)
    with GatheredParameters(layer.parameters(), modifier_rank=0) as gathered:
        assert gathered is None
        with torch.no_grad():
            layer.weight.fill_(2.0)
    torch.testing.assert_close(layer.weight.detach(), torch.full((2, 3), 2.0))
    with GatheredParameters(torch.zeros(3)):
        pass


def _run_bad_modifier():
    import deepspeed

    engine = _engine(make_model())
    try:
        deepspeed.zero.GatheredParameters(engine.module.a.weight, modifier_rank=5)
    except ValueError as exc:
        return str(exc)
    return None


def test_bad_modifier_rank_is_a_clear_error(dist_pool):
    for message in dist_pool.run(_run_bad_modifier, world_size=2):
        assert message is not None and "modifier_rank=5" in message and "0..1" in message


# ---------------------------------------------------------------------- external parameters
VOCAB, HIDDEN, SEQ = 11, 6, 4


class Head(torch.nn.Module):
    """A tied LM head: uses the embedding's weight, which another module owns. With
    ``hidden`` it holds the Parameter object itself (reads bypass ``Module.__getattr__``, so
    ZeRO-3 cannot notice the use); otherwise it reads ``embed.weight`` as an attribute."""

    def __init__(self, embed, mode):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(VOCAB))
        self._embed = [embed]  # hidden from named_parameters: the embedding owns the weight
        self._weight = [embed.weight]
        self.mode = mode

    def forward(self, h):
        if self.mode == "auto":
            return F.linear(h, self._embed[0].weight, self.bias)
        weight = self._weight[0]
        if self.mode != "fwd_module":
            return F.linear(h, weight, self.bias)
        from deepspeed.zero import GatheredParameters

        with GatheredParameters(weight, fwd_module=self):
            return F.linear(h, weight, self.bias)


class TiedLM(torch.nn.Module):
    def __init__(self, mode="auto"):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.body = torch.nn.Linear(HIDDEN, HIDDEN)
        self.head = Head(self.embed, mode)

    def forward(self, ids):
        return self.head(torch.tanh(self.body(self.embed(ids))))


def _tied_data(steps, world):
    g = torch.Generator().manual_seed(3)
    n = steps * MICRO * world
    return torch.randint(0, VOCAB, (n, SEQ), generator=g), torch.randint(0, VOCAB, (n, SEQ),
                                                                         generator=g)


def _tied_loss(model, ids, targets):
    return F.cross_entropy(model(ids).reshape(-1, VOCAB), targets.reshape(-1))


def _tied_model(mode="auto"):
    torch.manual_seed(0)
    return TiedLM(mode)


STEPS = 3


def _run_tied(mode):
    import deepspeed
    from deepspeed import comm as dist

    model = _tied_model(mode)
    engine = _engine(model, groups=[{"params": list(model.parameters()), "weight_decay": 0.0}])
    if mode == "registered":
        deepspeed.zero.register_external_parameter(engine.module.head, engine.module.embed.weight)
    rank, world = dist.get_rank(), dist.get_world_size()
    ids, targets = _tied_data(STEPS, world)
    try:
        for s in range(STEPS):
            start = s * MICRO * world + rank * MICRO
            batch = slice(start, start + MICRO)
            engine.backward(_tied_loss(engine, ids[batch], targets[batch]))
            engine.step()
    except RuntimeError as exc:
        return str(exc)
    from deepspeed.zero.stage3 import module_params

    head_uses_embedding = any(p is engine.module.embed.weight
                              for p in module_params(engine.module.head))
    return {n: _whole(p) for n, p in engine.module.named_parameters()}, head_uses_embedding


def _tied_reference(world):
    model = _tied_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    ids, targets = _tied_data(STEPS, world)
    size = MICRO * world
    for s in range(STEPS):
        batch = slice(s * size, (s + 1) * size)
        _tied_loss(model, ids[batch], targets[batch]).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("mode", ["registered", "fwd_module", "auto"])
def test_external_parameter_trains_like_reference(dist_pool, world, mode):
    expected = _tied_reference(world)
    for result in dist_pool.run(_run_tied, world_size=world, args=(mode,)):
        assert isinstance(result, tuple), result  # else the error message
        trained, head_uses_embedding = result
        assert head_uses_embedding  # registered (by hand, by fwd_module or detected)
        assert trained.keys() == expected.keys()
        for name, want in expected.items():
            torch.testing.assert_close(trained[name], want, rtol=0, atol=1e-6, msg=name)


def test_unregistered_external_parameter_fails_clearly(dist_pool):
    # a use ZeRO-3 cannot see (not an attribute read during a forward) and no registration:
    # the head gets the embedding weight as its released, empty 1-D placeholder, which torch
    # rejects ("mat2 must be a matrix, got 1-D tensor")
    for message in dist_pool.run(_run_tied, world_size=2, args=("hidden",)):
        assert isinstance(message, str), "training with an unregistered tied weight succeeded"
        assert "matrix" in message and "1-D" in message, message


def test_register_external_parameter_needs_a_parameter():
    from deepspeed.zero import register_external_parameter, unregister_external_parameter

    module = torch.nn.Linear(2, 2)
    with pytest.raises((TypeError, RuntimeError), match="Parameter"):
        register_external_parameter(module, torch.zeros(2))
    other = torch.nn.Parameter(torch.zeros(2))
    register_external_parameter(module, other)
    unregister_external_parameter(module, other)
    with pytest.raises((ValueError, RuntimeError), match="not registered"):
        unregister_external_parameter(module, other)
