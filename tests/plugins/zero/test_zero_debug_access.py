"""``deepspeed.utils.safe_get_*/safe_set_*`` under ZeRO 1/2/3 (and NVMe) on 2 and 3 gloo ranks,
against single-process AdamW on the global batch."""
import pytest
import torch

from deepspeed.hooks import PARAM_STATE_ACCESS

from zero_models import (CLIP, LR, MICRO, assert_offloaded, assert_on_engine_device,
                         full_params, make_data, make_model, micro_batch, param_groups, placement)

STEPS = 2  # steps before the checks; one more step follows the setters
KEYS = ("exp_avg", "exp_avg_sq")


def _ref_backward(model, x, y, step, world):
    size = MICRO * world
    batch = slice(step * size, (step + 1) * size)
    torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()


def _ref_step(model, opt):
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], CLIP)
    opt.step()
    opt.zero_grad()


def reference(world):
    """What the ZeRO run must report at each phase: after STEPS steps (params, Adam moments),
    the gradient of the next backward, and the params after a step taken once a.weight was set
    to zeros and b.weight's exp_avg to ones."""
    model = make_model()
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    x, y = make_data(STEPS + 1, 1, world)
    for s in range(STEPS):
        _ref_backward(model, x, y, s, world)
        _ref_step(model, opt)
    named = dict(model.named_parameters())
    out = {"params": {n: p.detach().clone() for n, p in named.items()},
           "state": {(n, k): opt.state[p][k].clone() for n, p in named.items()
                     if p in opt.state for k in KEYS}}
    _ref_backward(model, x, y, STEPS, world)
    out["grads"] = {n: p.grad.clone() for n, p in named.items() if p.grad is not None}
    with torch.no_grad():
        model.a.weight.zero_()
        opt.state[model.b.weight]["exp_avg"].fill_(1.0)
    _ref_step(model, opt)
    out["after"] = {n: p.detach().clone() for n, p in named.items()}
    return out


def _engine(stage, zero):
    import deepspeed

    model = make_model()
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_clipping": CLIP,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": dict({"stage": stage}, **zero)}
    if stage == 3:
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                           config=config)
    return engine


def _forward_backward(engine, x, y, step):
    from deepspeed import comm as dist

    xb, yb = micro_batch(x, y, step, 0, dist.get_rank(), 1, dist.get_world_size())
    engine.backward(torch.nn.functional.mse_loss(engine(xb), yb))


def _run_debug_access(stage, zero):
    from deepspeed import comm as dist
    from deepspeed.utils import (safe_get_full_fp32_param, safe_get_full_grad,
                                 safe_get_full_optimizer_state, safe_get_local_fp32_param,
                                 safe_get_local_grad, safe_get_local_optimizer_state,
                                 safe_set_full_fp32_param, safe_set_full_optimizer_state)

    engine = _engine(stage, zero)
    world = dist.get_world_size()
    x, y = make_data(STEPS + 1, 1, world)
    for s in range(STEPS):
        _forward_backward(engine, x, y, s)
        engine.step()
    trained = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
    out = {"params": {n: safe_get_full_fp32_param(p) for n, p in trained},
           "state": {(n, k): safe_get_full_optimizer_state(p, k) for n, p in trained
                     for k in KEYS},
           "local_params": {n: safe_get_local_fp32_param(p) for n, p in trained},
           "local_state": {n: safe_get_local_optimizer_state(p, "exp_avg_sq")
                           for n, p in trained},
           # not trained, so no ZeRO optimizer: the parameter itself (gathered under ZeRO-3)
           "frozen": safe_get_full_fp32_param(engine.module.frozen.weight)}
    _forward_backward(engine, x, y, STEPS)
    out["grads"] = {n: safe_get_full_grad(p) for n, p in trained}
    out["local_grads"] = {n: safe_get_local_grad(p) for n, p in trained}
    model = engine.module
    safe_set_full_fp32_param(model.a.weight, torch.zeros(13, 7))
    safe_set_full_optimizer_state(model.b.weight, torch.ones(5, 13), "exp_avg")
    out["set"] = (safe_get_full_fp32_param(model.a.weight),
                  safe_get_full_optimizer_state(model.b.weight, "exp_avg"),
                  full_params(model)["a.weight"])  # what the next forward would use
    engine.step()
    out["after"] = {n: safe_get_full_fp32_param(p) for n, p in trained}
    if zero.get("offload_optimizer", {}).get("device") != "nvme":  # NVMe: masters are on disk
        out["placement"] = placement(engine)
    return out


def _gather_local(results, key, name):
    """Concatenate the ranks' local fragments in rank order."""
    return torch.cat([r[key][name] for r in results])


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_getters_and_setters_match_reference(dist_pool, stage, world):
    results = dist_pool.run(_run_debug_access, world_size=world, args=(stage, {}))
    _check(results, reference(world))
    for r in results:
        assert_on_engine_device(r["placement"])


@pytest.mark.parametrize("stage", [2, 3])
def test_cpu_offload_matches_reference(dist_pool, stage):
    zero = {"offload_optimizer": {"device": "cpu"}, "sub_group_size": 9}
    results = dist_pool.run(_run_debug_access, world_size=2, args=(stage, zero))
    _check(results, reference(2))
    for r in results:  # the accessors above read and wrote these host-side masters
        assert_offloaded(r["placement"], pinned=False)


@pytest.mark.parametrize("stage", [2, 3])
def test_nvme_sub_groups_match_reference(dist_pool, tmp_path, stage):
    # sub_group_size 9: fragments span several fp32 chunks, each kept on disk between
    # accesses; at stage 3 the parameter shards live on disk too
    nvme = {"device": "nvme", "nvme_path": str(tmp_path)}
    zero = {"offload_optimizer": nvme, "sub_group_size": 9}
    if stage == 3:
        zero["offload_param"] = nvme
    results = dist_pool.run(_run_debug_access, world_size=2, args=(stage, zero))
    _check(results, reference(2))


def _check(results, ref):
    close = dict(rtol=0, atol=1e-6)
    for rank, r in enumerate(results):
        torch.testing.assert_close(r["frozen"], ref["params"]["frozen.weight"], rtol=0, atol=0)
        for name, want in ref["params"].items():
            if name.startswith("frozen"):
                continue
            torch.testing.assert_close(r["params"][name], want, **close, msg=name)
            full = ref["grads"].get(name, torch.zeros_like(want))  # "unused" reduces to zero
            torch.testing.assert_close(r["grads"][name], full, **close, msg=name)
        for (name, key), want in ref["state"].items():
            torch.testing.assert_close(r["state"][(name, key)], want, **close, msg=(name, key))
        torch.testing.assert_close(r["set"][0], torch.zeros(13, 7), rtol=0, atol=0)
        torch.testing.assert_close(r["set"][1], torch.ones(5, 13), rtol=0, atol=0)
        torch.testing.assert_close(r["set"][2], torch.zeros(13, 7), rtol=0, atol=0)
        for name, want in ref["after"].items():
            if name.startswith("frozen"):
                continue
            # exp_avg = 1 over a tiny exp_avg_sq amplifies rounding: looser than the rest
            torch.testing.assert_close(r["after"][name], want, rtol=1e-5, atol=1e-5,
                                       msg=f"after {name}")
    for name in results[0]["local_params"]:
        torch.testing.assert_close(_gather_local(results, "local_params", name),
                                   results[0]["params"][name].reshape(-1), rtol=0, atol=0)
        torch.testing.assert_close(_gather_local(results, "local_grads", name),
                                   results[0]["grads"][name].reshape(-1), rtol=0, atol=0)
        torch.testing.assert_close(_gather_local(results, "local_state", name),
                                   results[0]["state"][(name, "exp_avg_sq")].reshape(-1),
                                   rtol=0, atol=0)


def _run_local_setters(stage):
    from deepspeed import comm as dist
    from deepspeed.utils import (safe_get_full_fp32_param, safe_get_full_optimizer_state,
                                 safe_get_local_fp32_param, safe_set_local_fp32_param,
                                 safe_set_local_optimizer_state)

    engine = _engine(stage, {})
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_data(2, 1, world)
    _forward_backward(engine, x, y, 0)
    engine.step()
    weight = engine.module.a.weight
    size = safe_get_local_fp32_param(weight).numel()
    # ZeRO-3 also takes the padded shard (``ds_tensor``'s size); the padding is ignored
    given = weight.ds_tensor.numel() if stage == 3 else size
    safe_set_local_fp32_param(weight, torch.full((given,), rank + 1.0))
    safe_set_local_optimizer_state(weight, torch.full((size,), 10.0 * (rank + 1)), "exp_avg_sq")
    master = safe_get_full_fp32_param(weight)
    state = safe_get_full_optimizer_state(weight, "exp_avg_sq")
    # the model's own copy of this rank's fragment changed too
    if stage == 3:
        model_fragment = weight.ds_tensor.narrow(0, 0, size).clone()
    else:
        start = getattr(weight, PARAM_STATE_ACCESS).fragment_of(weight).start
        model_fragment = weight.detach().reshape(-1).narrow(0, start, size).clone()
    return size, master, state, model_fragment


@pytest.mark.parametrize("stage", [2, 3])
def test_local_setters_write_each_ranks_fragment(dist_pool, stage):
    results = dist_pool.run(_run_local_setters, world_size=2, args=(stage,))
    sizes = [r[0] for r in results]
    expected = torch.cat([torch.full((n,), rank + 1.0) for rank, n in enumerate(sizes)])
    assert sum(sizes) == 13 * 7
    for _, master, state, model_fragment in results:
        torch.testing.assert_close(master.reshape(-1), expected, rtol=0, atol=0)
        torch.testing.assert_close(state.reshape(-1), expected * 10, rtol=0, atol=0)
    for rank, r in enumerate(results):
        torch.testing.assert_close(r[3], torch.full((sizes[rank],), rank + 1.0), rtol=0, atol=0)


def _run_errors():
    from deepspeed.utils import (safe_get_full_optimizer_state, safe_set_full_fp32_param,
                                 safe_set_local_fp32_param)

    engine = _engine(2, {})
    weight = engine.module.a.weight
    errors = []
    for call in (lambda: safe_set_full_fp32_param(weight, torch.zeros(3)),
                 lambda: safe_set_local_fp32_param(weight, torch.zeros(10_000)),
                 lambda: safe_get_full_optimizer_state(weight, "exp_avg")):
        try:
            call()
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_bad_values_and_missing_state_are_clear_errors(dist_pool):
    for errors in dist_pool.run(_run_errors, world_size=2):
        assert len(errors) == 3
        assert "'a.weight'" in errors[0] and "3 elements" in errors[0] and "(13, 7)" in errors[0]
        assert "10000 elements" in errors[1]
        assert "'exp_avg'" in errors[2] and "first step" in errors[2]


def test_without_zero_the_parameter_itself_is_returned():
    from deepspeed.utils import (safe_get_full_fp32_param, safe_get_full_grad,
                                 safe_get_full_optimizer_state, safe_get_local_fp32_param,
                                 safe_set_full_fp32_param, safe_set_full_optimizer_state)

    layer = torch.nn.Linear(3, 2)
    layer(torch.ones(1, 3)).sum().backward()
    torch.testing.assert_close(safe_get_full_fp32_param(layer.weight), layer.weight.detach())
    assert safe_get_full_grad(layer.weight) is layer.weight.grad
    assert safe_get_full_optimizer_state(layer.weight, "exp_avg") is None
    assert safe_get_local_fp32_param(layer.weight).shape == (6,)
    safe_set_full_fp32_param(layer.weight, torch.ones(2, 3))
    torch.testing.assert_close(layer.weight.detach(), torch.ones(2, 3))
    with pytest.raises(ValueError, match="not reachable"):
        safe_set_full_optimizer_state(layer.weight, torch.ones(2, 3), "exp_avg")


def _run_grad_setters(stage):
    """A fresh engine's first step after the gradients were replaced: AdamW's first update is
    ``-lr * g / (|g| + eps)`` per element, so each weight moves by ``-lr * sign(g set)``
    whatever the batch's gradient was (clipping only scales ``g``)."""
    from deepspeed import comm as dist
    from deepspeed.utils import (safe_get_full_fp32_param, safe_get_full_grad,
                                 safe_get_local_grad, safe_set_full_grad, safe_set_local_grad)

    engine = _engine(stage, {})
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_data(1, 1, world)
    _forward_backward(engine, x, y, 0)
    a, b = engine.module.a.weight, engine.module.b.weight
    before = {"a": safe_get_full_fp32_param(a), "b": safe_get_full_fp32_param(b)}
    signs = torch.ones(13, 7)
    signs[::2] = -1.0
    safe_set_full_grad(a, signs * 3.0)
    local = safe_get_local_grad(b)
    safe_set_local_grad(b, torch.full_like(local, -2.0 if rank == 0 else 2.0))
    read_back = (safe_get_full_grad(a), safe_get_local_grad(b))
    engine.step()
    moved = {"a": safe_get_full_fp32_param(a) - before["a"],
             "b": safe_get_full_fp32_param(b) - before["b"]}
    return read_back, local.numel(), moved, before["b"]


@pytest.mark.parametrize("stage", [1, 3])
def test_grad_setters_replace_the_gradient_the_step_uses(dist_pool, stage):
    results = dist_pool.run(_run_grad_setters, world_size=2, args=(stage,))
    signs = torch.ones(13, 7)
    signs[::2] = -1.0
    sizes = [r[1] for r in results]
    b_signs = torch.cat([torch.full((sizes[0],), -1.0), torch.full((sizes[1],), 1.0)])
    for rank, ((full_a, local_b), _, moved, b_before) in enumerate(results):
        torch.testing.assert_close(full_a, signs * 3.0, rtol=0, atol=0)
        assert torch.all(local_b == (-2.0 if rank == 0 else 2.0))
        torch.testing.assert_close(moved["a"], -LR * signs, rtol=1e-4, atol=1e-7)
        # b's group has weight decay 0.1: AdamW also shrinks the weight by lr * wd * w
        torch.testing.assert_close(moved["b"].reshape(-1),
                                   -LR * 0.1 * b_before.reshape(-1) - LR * b_signs,
                                   rtol=1e-4, atol=1e-7)


def test_grad_setters_without_zero_write_param_grad():
    from deepspeed.utils import safe_get_local_grad, safe_set_full_grad, safe_set_local_grad

    layer = torch.nn.Linear(3, 2)
    safe_set_full_grad(layer.weight, torch.ones(2, 3))  # no gradient yet: one is made
    torch.testing.assert_close(layer.weight.grad, torch.ones(2, 3))
    grad = layer.weight.grad
    safe_set_local_grad(layer.weight, torch.arange(6.0))
    assert layer.weight.grad is grad  # written in place
    torch.testing.assert_close(safe_get_local_grad(layer.weight), torch.arange(6.0))
    opt = torch.optim.SGD(layer.parameters(), lr=1.0)
    before = layer.weight.detach().clone()
    opt.step()
    torch.testing.assert_close(layer.weight.detach(), before - torch.arange(6.0).view(2, 3))
