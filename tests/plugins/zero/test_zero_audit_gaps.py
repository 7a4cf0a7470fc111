"""ZeRO behaviours the HF-integration checklist relies on that the other ZeRO tests leave open:
clipping with a large loss, client optimizers, documented refusals, ZeRO-3 persistence and
prefetch knobs, rank-divergent inference, ``zero.Init`` as a decorator, and fp16 resume.
Every number is checked against plain PyTorch computed here."""
import logging

import pytest
import torch
import torch.nn.functional as F

from zero_models import (LR, MICRO, Net, full_params, make_data, make_model, micro_batch,
                         param_groups, reference, train)

SCALE = 1e3  # makes every gradient norm far above the clip threshold


def _assert_params(got, want, atol=1e-6):
    assert got.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=atol, msg=name)


# ------------------------------------------------------------------ 1. clipping triggers
def _clip_reference(steps, world):
    model = make_model()
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    x, y = make_data(steps, 1, world)
    size = MICRO * world
    norms = []
    for s in range(steps):
        batch = slice(s * size, (s + 1) * size)
        (F.mse_loss(model(x[batch]), y[batch]) * SCALE).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(
            [p for p in model.parameters() if p.grad is not None], 1.0)))
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}, norms


def _clip_run(stage, steps):
    import deepspeed
    from deepspeed import comm as dist

    model = make_model()
    zero = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}}, "zero_optimization": zero}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                      config=config)
    world, rank = dist.get_world_size(), dist.get_rank()
    x, y = make_data(steps, 1, world)
    norms = []
    for s in range(steps):
        xb, yb = micro_batch(x, y, s, 0, rank, 1, world)
        engine.backward(F.mse_loss(engine(xb), yb) * SCALE)
        engine.step()
        norms.append(float(engine.get_global_grad_norm()))
    return full_params(engine.module), norms


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_clipping_with_large_loss_matches_clip_grad_norm(dist_pool, stage):
    want_params, want_norms = _clip_reference(2, 2)
    assert min(want_norms) > 10.0  # clipping really happens
    for params, norms in dist_pool.run(_clip_run, world_size=2, args=(stage, 2)):
        torch.testing.assert_close(torch.tensor(norms), torch.tensor(want_norms), rtol=1e-5,
                                   atol=0)
        _assert_params(params, want_params)


# ------------------------------------------------------------------ 2. client optimizers
def _client_reference(steps, world):
    """HF-style groups (decay / no decay); ``unused`` sits in the no-decay group because ZeRO
    gives it a zero gradient where torch gives none, and only decay would tell them apart."""
    model = make_model()
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    x, y = make_data(steps, 1, world)
    size = MICRO * world
    for s in range(steps):
        batch = slice(s * size, (s + 1) * size)
        F.mse_loss(model(x[batch]), y[batch]).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _client_run(stage, steps):
    import deepspeed

    model = make_model()
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0}
    config = {"train_micro_batch_size_per_gpu": MICRO, "zero_allow_untested_optimizer": True,
              "zero_optimization": zero}
    engine, optimizer, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(param_groups(model), lr=LR), config=config)
    assert type(optimizer).__name__ == "DeepSpeedZeroOptimizer"
    return train(engine, steps, 1)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_client_adamw_trains_like_reference(dist_pool, stage):
    want = _client_reference(2, 2)
    for params in dist_pool.run(_client_run, world_size=2, args=(stage, 2)):
        _assert_params(params, want)


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _untested_optimizer(allow):
    import deepspeed
    from deepspeed.utils.logging import logger

    model = make_model()
    config = {"train_micro_batch_size_per_gpu": MICRO, "zero_optimization": {"stage": 1}}
    if allow is not None:
        config["zero_allow_untested_optimizer"] = allow
    capture = _Capture()
    logger.addHandler(capture)
    try:
        deepspeed.initialize(model=model, config=config,
                             optimizer=torch.optim.SGD(model.parameters(), lr=LR))
    except ValueError as error:
        return "error", str(error)
    finally:
        logger.removeHandler(capture)
    return "ok", capture.messages


def test_untested_client_optimizer_warns_with_flag_and_fails_without(dist_pool):
    for outcome, messages in dist_pool.run(_untested_optimizer, world_size=2, args=(True,)):
        assert outcome == "ok"
        assert any("untested optimizer (SGD)" in m for m in messages), messages
    for allow in (None, False):
        for outcome, message in dist_pool.run(_untested_optimizer, world_size=2, args=(allow,)):
            assert outcome == "error"
            assert "zero_allow_untested_optimizer" in message and "SGD" in message


# ------------------------------------------------------------------ 3. documented refusals
def _refusal(config_extra, lamb):
    import deepspeed
    from deepspeed.ops.lamb import FusedLamb

    model = make_model()
    config = dict({"train_micro_batch_size_per_gpu": MICRO}, **config_extra)
    kwargs = {"optimizer": FusedLamb(model.parameters(), lr=LR)} if lamb else \
        {"model_parameters": model.parameters()}
    if not lamb:
        config["optimizer"] = {"type": "AdamW", "params": {"lr": LR}}
    try:
        deepspeed.initialize(model=model, config=config, **kwargs)
    except ValueError as error:
        return str(error)
    return None


def test_amp_with_zero_is_refused(dist_pool):
    extra = {"amp": {"enabled": True}, "zero_optimization": {"stage": 2}}
    for message in dist_pool.run(_refusal, world_size=2, args=(extra, False)):
        assert message is not None and "Amp and ZeRO are not currently compatible" in message


def test_lamb_with_cpu_offload_is_refused(dist_pool):
    """The LAMB/offload refusal answers for itself, with or without the untested-optimizer
    flag (Lamb is not in the tested list, but "untested" is not why it cannot run)."""
    zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    for message in dist_pool.run(_refusal, world_size=2, args=({"zero_optimization": zero},
                                                                True)):
        assert message is not None and "LAMB" in message and "offload_optimizer" in message
        assert "untested" not in message
    extra = {"zero_optimization": zero, "zero_allow_untested_optimizer": True}
    for message in dist_pool.run(_refusal, world_size=2, args=(extra, True)):
        assert message is not None and "LAMB" in message and "offload_optimizer" in message


# ------------------------------------------------------------------ 4. ZeRO-3 knobs
def _z3_run(zero, steps, count_gathers):
    import deepspeed
    from deepspeed import comm as dist

    model = make_model()
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_clipping": 0.5,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": dict({"stage": 3}, **zero)}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                      config=config)
    ops = {"forward_backward": [], "step": []}
    if count_gathers:
        # the targets of make_data depend on its length: draw the batches of all ``steps``
        world, rank = dist.get_world_size(), dist.get_rank()
        x, y = make_data(steps, 1, world)
        xb, yb = micro_batch(x, y, 0, 0, rank, 1, world)
        engine.backward(F.mse_loss(engine(xb), yb))
        engine.step()  # the first step records the module trace
        xb, yb = micro_batch(x, y, 1, 0, rank, 1, world)
        for phase, work in (("forward_backward", lambda: engine.backward(
                F.mse_loss(engine(xb), yb))), ("step", engine.step)):
            record = ops[phase].append
            dist.add_comm_observer(record)
            try:
                work()
            finally:
                dist.remove_comm_observer(record)
        params = train(engine, steps - 2, 1, first_step=2)
    else:
        params = train(engine, steps, 1)
    persistent = all(getattr(p, "ds_persist", False) for p in engine.module.parameters())
    return params, {k: sorted({r.op for r in v}) for k, v in ops.items()}, persistent


def test_huge_persistence_threshold_gathers_nothing_in_forward_backward(dist_pool):
    """Persistent parameters stay whole, so forward and backward fetch nothing; the optimizer
    still owns only a partition of each, so the step all-gathers the updated values (as
    upstream does for its persistent parameters after the step)."""
    zero = {"stage3_param_persistence_threshold": 10**9}
    want = reference(3, 1, 2)
    for params, ops, persistent in dist_pool.run(_z3_run, world_size=2, args=(zero, 3, True)):
        assert persistent
        assert "reduce_scatter_tensor" in ops["forward_backward"] + ops["step"], ops
        assert not any("gather" in op for op in ops["forward_backward"]), ops
        _assert_params(params, want)
    # the control: with threshold 0 the same observer sees forward/backward all-gathers
    for _, ops, persistent in dist_pool.run(
            _z3_run, world_size=2, args=({"stage3_param_persistence_threshold": 0}, 3, True)):
        assert not persistent and any("gather" in op for op in ops["forward_backward"]), ops


def test_prefetch_bucket_size_does_not_change_the_math(dist_pool):
    runs = [dist_pool.run(_z3_run, world_size=2,
                          args=({"stage3_param_persistence_threshold": 0,
                                 "stage3_prefetch_bucket_size": size}, 3, False))
            for size in (0, 10**9)]
    want = reference(3, 1, 2)
    for (small, _, _), (large, _, _) in zip(*runs):
        _assert_params(small, large, atol=0)
        _assert_params(small, want)


# ------------------------------------------------------------------ 5. rank-divergent inference
def _step_input(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(MICRO, 7, generator=g)


def _z3_inference(lengths):
    import deepspeed
    from deepspeed import comm as dist

    config = {"train_micro_batch_size_per_gpu": MICRO,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, *_ = deepspeed.initialize(model=make_model(), config=config)
    engine.module.eval()
    rank = dist.get_rank()
    assert all(p.numel() == 0 for p in engine.module.parameters())
    with torch.no_grad():
        single = engine(_step_input(rank, 99))
        outputs, step, forwards = [], 0, 0
        while True:  # "synced generation": finished ranks keep joining the gathers
            done = step >= lengths[rank]
            out = engine(_step_input(rank, 0 if done else step))
            forwards += 1
            if not done:
                outputs.append(out)
            pending = torch.tensor([0.0 if done else 1.0])
            dist.all_reduce(pending)
            if pending.item() == 0:
                break
            step += 1
    return single, outputs, forwards


def test_zero3_inference_with_different_inputs_and_lengths_per_rank(dist_pool):
    lengths = [3, 5]
    model = make_model().eval()
    results = dist_pool.run(_z3_inference, world_size=2, args=(lengths,))
    with torch.no_grad():
        for rank, (single, outputs, forwards) in enumerate(results):
            torch.testing.assert_close(single, model(_step_input(rank, 99)), rtol=0, atol=1e-6)
            assert len(outputs) == lengths[rank] and forwards == max(lengths) + 1
            for step, out in enumerate(outputs):
                torch.testing.assert_close(out, model(_step_input(rank, step)), rtol=0,
                                           atol=1e-6)


# ------------------------------------------------------------------ 6. zero.Init forms
class _DecoratedNet(Net):
    def __init__(self):
        import deepspeed

        @deepspeed.zero.Init(config_dict_or_path={"zero_optimization": {
            "stage": 3, "stage3_param_persistence_threshold": 0}})
        def build():
            super(_DecoratedNet, self).__init__()

        build()


def _init_forms():
    import deepspeed
    from deepspeed import comm as dist

    config = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}

    @deepspeed.zero.Init(config_dict_or_path=config)
    def build():
        torch.manual_seed(0)
        return Net()

    torch.manual_seed(0)
    decorated_init = _DecoratedNet()
    with deepspeed.zero.Init(enabled=False):
        torch.manual_seed(0)
        whole = Net()
    torch.manual_seed(1000 + dist.get_rank())  # every rank draws a different initialisation
    with deepspeed.zero.Init(config_dict_or_path=config):
        divergent = Net()

    def sharded(module):
        return all(hasattr(p, "ds_id") and p.numel() == 0 for p in module.parameters())

    whole_ok = all(not hasattr(p, "ds_id") for p in whole.parameters())
    return (sharded(build()), full_params(build()), sharded(decorated_init),
            full_params(decorated_init), whole_ok, full_params(whole), full_params(divergent))


def test_zero_init_decorator_disabled_and_rank0_initialisation(dist_pool):
    torch.manual_seed(0)
    want = {n: p.detach().clone() for n, p in Net().named_parameters()}
    torch.manual_seed(1000)  # rank 0's seed wins
    rank0 = {n: p.detach().clone() for n, p in Net().named_parameters()}
    for (fn_sharded, fn_params, init_sharded, init_params, whole_ok, whole,
         divergent) in dist_pool.run(_init_forms, world_size=2):
        assert fn_sharded and init_sharded and whole_ok
        _assert_params(fn_params, want, atol=0)
        _assert_params(init_params, want, atol=0)
        _assert_params(whole, want, atol=0)
        _assert_params(divergent, rank0, atol=0)


# ------------------------------------------------------------------ 7. fp16 resume
FP16 = {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 2}


def _fp16_engine():
    import deepspeed

    model = make_model()
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_clipping": 0.5, "fp16": FP16,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 2}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                      config=config)
    return engine


def _fp16_steps(engine, x, y, steps):
    from deepspeed import comm as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    for s in steps:
        xb, yb = micro_batch(x, y, s, 0, rank, 1, world)
        engine.backward(F.mse_loss(engine(xb.half()).float(), yb))
        engine.step()


def _fp16_resume(save_dir):
    from deepspeed import comm as dist

    x, y = make_data(4, 1, dist.get_world_size())
    engine = _fp16_engine()
    _fp16_steps(engine, x, y, range(2))
    scale_at_save = engine.optimizer.cur_scale
    engine.save_checkpoint(save_dir, tag="step2")
    _fp16_steps(engine, x, y, range(2, 4))
    straight = (full_params(engine.module), engine.optimizer.cur_scale, engine.global_steps)

    resumed = _fp16_engine()
    resumed.load_checkpoint(save_dir, tag="step2")
    loaded_scale = resumed.optimizer.cur_scale
    _fp16_steps(resumed, x, y, range(2, 4))
    return (straight, (full_params(resumed.module), resumed.optimizer.cur_scale,
                       resumed.global_steps), scale_at_save, loaded_scale)


def test_fp16_zero2_resume_is_bit_identical(dist_pool, tmp_path):
    for straight, resumed, scale_at_save, loaded_scale in dist_pool.run(
            _fp16_resume, world_size=2, args=(str(tmp_path),)):
        assert scale_at_save == 2.0 ** 9  # 256 doubled after a window of 2 clean steps
        assert loaded_scale == scale_at_save
        assert straight[1] == resumed[1] and straight[2] == resumed[2] == 4
        _assert_params(resumed[0], straight[0], atol=0)
