"""What ZeRO stages 1/2 hold and send per rank, their precision handling, and their refusals."""
import pytest
import torch

from zero_models import ds_config, make_model, param_groups, train


def _trainable_numel(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _init(stage, gas=1, model=None, config=None, **zero):
    import deepspeed

    model = model or make_model()
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, model_parameters=param_groups(model),
        config=config or ds_config(stage, gas, **zero))
    return engine, optimizer


def _state_bytes(stage):
    """Per-rank bytes of fp32 masters + Adam moments, and of gradients after one backward."""
    from deepspeed import comm as dist

    engine, optimizer = _init(stage, gas=2)
    x = torch.randn(2, 7)
    engine.backward(engine(x).pow(2).mean())  # not yet the accumulation boundary
    full_grads = sum(p.grad.numel() for p in engine.module.parameters() if p.grad is not None)
    engine.step()
    engine.backward(engine(x).pow(2).mean())
    engine.step()
    masters = sum(c.numel() * c.element_size() for c in optimizer.master_params())
    moments = sum(v.numel() * v.element_size() for state in optimizer.state.values()
                  for v in state.values() if torch.is_tensor(v) and v.dim() == 1)
    grad_partition = sum(g.numel() for g in optimizer.grad_partitions)
    return (_trainable_numel(engine.module), dist.get_world_size(), masters, moments, full_grads,
            grad_partition, len([b for layout in optimizer.layouts for b in layout.buckets]))


@pytest.mark.parametrize("stage", [1, 2])
def test_master_weights_and_adam_state_are_one_nth_per_rank(dist_pool, stage):
    results = dist_pool.run(_state_bytes, world_size=3, args=(stage,))
    for total, world, masters, moments, full_grads, grad_partition, buckets in results:
        share = -(-total // world)
        slack = buckets  # at most world-1 padding elements per bucket, split over the ranks
        assert share * 4 <= masters <= (share + slack) * 4
        assert share * 8 <= moments <= (share + slack) * 8  # exp_avg + exp_avg_sq
        assert share <= grad_partition <= share + slack
        if stage == 2:
            assert full_grads == 0  # backward already reduced and freed every full gradient
        else:
            assert full_grads == total - 9 - 3  # stage 1 keeps them (all but the unused layer)
    assert sum(r[2] for r in results) >= results[0][0] * 4  # together they hold everything


def _comm_volume(stage):
    from deepspeed import comm as dist

    engine, optimizer = _init(stage)
    records = []
    dist.add_comm_observer(records.append)
    try:
        x = torch.randn(2, 7)
        engine.backward(engine(x).pow(2).mean())
        engine.step()
    finally:
        dist.remove_comm_observer(records.append)
    by_op = {}
    for record in records:
        by_op[record.op] = by_op.get(record.op, 0) + record.size_bytes
    return _trainable_numel(engine.module), dist.get_world_size(), by_op


@pytest.mark.parametrize("stage", [1, 2])
def test_a_step_moves_one_reduce_scatter_and_one_all_gather(dist_pool, stage):
    total, world, by_op = dist_pool.run(_comm_volume, world_size=2, args=(stage,))[0]
    piece_elems = total / world
    # per-rank pieces, fp32: each collective moves piece * (N - 1) elements per rank
    rs = by_op.pop("reduce_scatter_tensor") / 4
    ag = by_op.pop("all_gather_into_tensor") / 4
    assert piece_elems <= rs <= piece_elems + 2 and piece_elems <= ag <= piece_elems + 2
    moved = (rs + ag) * (world - 1)
    assert moved == pytest.approx(2 * total * (world - 1) / world, abs=4)
    # left: the gradient-norm all-reduce (1 float64) and nothing like a full all-reduce
    assert set(by_op) <= {"all_reduce"} and by_op.get("all_reduce", 0) <= 16


def _half_vs_stage0(stage, precision):
    import deepspeed

    results = []
    for zero_stage in (0, stage):
        model = make_model()
        config = ds_config(zero_stage, 2, **({"stage3_param_persistence_threshold": 0}
                                             if zero_stage == 3 else {}))
        config[precision] = {"enabled": True}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                          config=config)
        results.append(train(engine, 3, 2))
        masters = engine.optimizer.master_params()
        assert all(m.dtype == torch.float32 for m in masters)
    return results


@pytest.mark.parametrize("precision,atol", [("bf16", 2e-2), ("fp16", 2e-3)])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_16bit_matches_the_core_mixed_precision_engine(dist_pool, stage, precision, atol):
    for stage0, zero in dist_pool.run(_half_vs_stage0, world_size=2, args=(stage, precision)):
        for name in stage0:
            # same fp32 masters, loss scaling and 16-bit communication; only the summation
            # order differs (partition sums vs one flat all-reduce)
            torch.testing.assert_close(zero[name], stage0[name], rtol=0, atol=atol, msg=name)


def _fp16_overflow_on_one_rank():
    from deepspeed import comm as dist

    config = ds_config(2, 1)
    config["fp16"] = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1}
    engine, optimizer = _init(2, config=config)
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    engine.backward(engine(torch.randn(2, 7).half()).float().pow(2).mean())
    if dist.get_rank() == 1:  # only rank 1's partition overflows
        optimizer.grad_partitions[0][0] = float("inf")
    engine.step()
    unchanged = all(torch.equal(before[n], p) for n, p in engine.module.named_parameters())
    scale_after_skip = optimizer.cur_scale
    engine.backward(engine(torch.randn(2, 7).half()).float().pow(2).mean())
    engine.step()
    changed = any(not torch.equal(before[n], p) for n, p in engine.module.named_parameters())
    return unchanged, scale_after_skip, engine.skipped_steps, changed


def test_fp16_overflow_on_one_rank_skips_the_step_on_all(dist_pool):
    for unchanged, scale, skipped, changed in dist_pool.run(_fp16_overflow_on_one_rank):
        assert unchanged and scale == 128.0 and skipped == 1 and changed


def _unused_parameter_is_an_error():
    config = ds_config(2, 1, ignore_unused_parameters=False)
    engine, _ = _init(2, config=config)
    try:
        engine.backward(engine(torch.randn(2, 7)).pow(2).mean())
    except RuntimeError as err:
        return str(err)
    return None


def test_unused_parameters_rejected_when_asked(dist_pool):
    for message in dist_pool.run(_unused_parameter_is_an_error):
        assert message and "unused.weight" in message and "ignore_unused_parameters" in message


def _refusal(case, path=None):
    import deepspeed

    model = make_model()
    config = ds_config(2, 1)
    kwargs = {}
    if case == "untested":
        del config["optimizer"]
        kwargs["optimizer"] = torch.optim.RMSprop(model.parameters(), lr=0.1)
    elif case == "untested-allowed":
        del config["optimizer"]
        config["zero_allow_untested_optimizer"] = True
        kwargs["optimizer"] = torch.optim.RMSprop(model.parameters(), lr=0.1)
    elif case == "offload-torch-optimizer":
        del config["optimizer"]
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        kwargs["optimizer"] = torch.optim.AdamW(model.parameters(), lr=0.1)
    elif case == "offload-torch-optimizer-allowed":
        del config["optimizer"]
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        config["zero_force_ds_cpu_optimizer"] = False
        kwargs["optimizer"] = torch.optim.AdamW(model.parameters(), lr=0.1)
    elif case == "nvme-missing":
        config["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": path}
    try:
        engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config, **kwargs)
    except (ValueError, RuntimeError) as err:
        return f"{type(err).__name__}: {err}"
    engine.backward(engine(torch.randn(2, 7)).pow(2).mean())
    engine.step()
    return "ok"


@pytest.mark.parametrize("case,expected", [
    ("untested", "zero_allow_untested_optimizer"),
    ("untested-allowed", "ok"),
    ("offload-torch-optimizer", "zero_force_ds_cpu_optimizer"),
    ("offload-torch-optimizer-allowed", "ok"),
    ("nvme-missing", "nvme_path"),
])
def test_documented_refusals(dist_pool, tmp_path, case, expected):
    for outcome in dist_pool.run(_refusal, args=(case, str(tmp_path / "absent"))):
        assert expected in outcome


def _timer_names(stage):
    config = ds_config(stage, 1)
    config["wall_clock_breakdown"] = True
    engine, _ = _init(stage, config=config)
    engine.backward(engine(torch.randn(2, 7)).pow(2).mean())
    engine.step()
    return sorted(name for name, timer in engine.timers.timers.items() if timer.count)


@pytest.mark.parametrize("stage,phase", [(1, "zero_reduce"), (2, "zero_reduce_wait")])
def test_wall_clock_breakdown_times_the_zero_phases(dist_pool, stage, phase):
    names = dist_pool.run(_timer_names, args=(stage,))[0]
    assert {phase, "zero_optimizer_step", "zero_allgather", "forward", "step"} <= set(names)
