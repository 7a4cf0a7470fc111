"""MoE with expert parallelism under ZeRO stages 1 and 2, with gradient clipping, in fp32 /
bf16 / fp16: the same weights as ZeRO-0 and as the single-process reference holding every
expert (trained on the global batch with ``torch.nn.utils.clip_grad_norm_``).

ZeRO partitions the expert param groups (split by
``split_params_into_different_moe_groups_for_optimizer``) over their expert-data-parallel
group (``deepspeed.hooks.GRADIENT_GROUP``); the global gradient norm counts dense gradients
once and sums expert gradients over the expert-parallel group
(``deepspeed.hooks.GRADIENT_NORM_GROUP``), so it is the reference's norm on every rank."""
import pytest
import torch

from moe_helpers import EXPERTS_PREFIX, MICRO, TinyMoEModel, ep_model, global_batches, \
    global_expert_name, loss_of, moe_param_groups, train_reference

LR, CLIP = 0.1, 0.05
KWARGS = {"num_experts": 4, "k": 1, "drop_tokens": True}


def _reference(data, clip):
    model, _, norms = train_reference(data, LR, clip, **KWARGS)
    return {name: p.detach().clone() for name, p in model.named_parameters()}, norms


def _train(ep_size, data, gas, stage, clip, extra=None):
    import deepspeed
    import deepspeed.comm as dist

    model, ep_rank = ep_model(ep_size, **KWARGS)
    param_groups = moe_param_groups(model)
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
              "optimizer": {"type": "SGD", "params": {"lr": LR}}, "steps_per_print": 10 ** 6,
              "gradient_clipping": clip, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage}, **(extra or {})}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups, config=config)
    rank = dist.get_rank()
    norms = []
    for step in data:
        for x, y in step[rank]:
            dtype = next(engine.module.parameters()).dtype
            pred, l_aux = engine(x.to(engine.device, dtype))
            loss = torch.nn.functional.mse_loss(pred.float(), y.to(engine.device)) \
                + 0.01 * l_aux.float()
            engine.backward(loss)
            engine.step()
        norms.append(engine.get_global_grad_norm())
    first_expert = ep_rank * model.moe.num_local_experts
    params = {global_expert_name(name, first_expert): p.detach().float().cpu().clone()
              for name, p in engine.module.named_parameters()}
    # how ZeRO partitioned each param group: over how many ranks, and the model's dtype
    sizes = [comm[2] for comm in getattr(engine.optimizer, "group_comms", [])]
    dtype = str(next(engine.module.parameters()).dtype)
    engine.destroy()
    return params, norms, sizes, dtype


def _assert_params(got, expected, atol):
    assert sorted(got) == sorted(n for n in expected if n in got)
    for name, value in got.items():
        torch.testing.assert_close(value, expected[name], atol=atol, rtol=0, msg=name)


def _all_experts(results, expected):
    """Every global expert turned up on some rank."""
    seen = {name for params, *_ in results for name in params}
    assert seen == set(expected)


@pytest.mark.parametrize("world", [2, 4])
def test_zero_1_and_2_with_clipping_equal_zero_0_and_the_reference(dist_pool, world):
    gas = 1 if world == 2 else 2
    data = global_batches(world, gas)
    expected, ref_norms = _reference(data, CLIP)
    assert all(n > CLIP for n in ref_norms)  # the clipping is active every step
    for stage in (0, 1, 2):
        results = dist_pool.run(_train, world_size=world, args=(2, data, gas, stage, CLIP))
        _all_experts(results, expected)
        for params, norms, sizes, _ in results:
            # dense over every rank, experts over the ranks holding the same experts
            assert sizes == ([] if stage == 0 else [world, world // 2])
            _assert_params(params, expected, 1e-6)
            assert norms == pytest.approx(ref_norms, rel=1e-6)


def test_zero_2_small_buckets_and_no_clipping(dist_pool):
    """Several buckets per group, chunked all-gathers, all-reduce instead of reduce-scatter."""
    data = global_batches(4, 1)
    expected, _ = _reference(data, 0)
    extra = {"zero_optimization": {"stage": 2, "reduce_bucket_size": 40,
                                   "allgather_bucket_size": 20, "reduce_scatter": False}}
    for params, *_ in dist_pool.run(_train, world_size=4, args=(2, data, 1, 2, 0, extra)):
        _assert_params(params, expected, 1e-6)


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("precision", [
    {"bf16": {"enabled": True}},
    {"fp16": {"enabled": True, "loss_scale": 128}},
])
def test_16_bit_runs_close_to_the_fp32_reference(dist_pool, stage, precision):
    data = global_batches(2, 1)
    expected, ref_norms = _reference(data, CLIP)
    results = dist_pool.run(_train, world_size=2, args=(2, data, 1, stage, CLIP, precision))
    dtype = "torch.bfloat16" if "bf16" in precision else "torch.float16"
    for params, norms, sizes, got_dtype in results:
        assert got_dtype == dtype and sizes == [2, 1]
        _assert_params(params, expected, 2e-2)
        assert norms == pytest.approx(ref_norms, rel=5e-2)
    # the 16-bit weights agree between ranks where they are the same weights
    dense = [n for n in results[0][0] if not n.startswith(EXPERTS_PREFIX)]
    for name in dense:
        torch.testing.assert_close(results[0][0][name], results[1][0][name], atol=0, rtol=0)


def test_zero_0_16_bit_with_clipping_runs_close_to_the_fp32_reference(dist_pool):
    data = global_batches(2, 1)
    expected, ref_norms = _reference(data, CLIP)
    results = dist_pool.run(_train, world_size=2,
                            args=(2, data, 1, 0, CLIP, {"bf16": {"enabled": True}}))
    for params, norms, _, dtype in results:
        assert dtype == "torch.bfloat16"
        _assert_params(params, expected, 2e-2)
        assert norms == pytest.approx(ref_norms, rel=5e-2)


def _refused_zero3(leaf):
    import deepspeed
    from deepspeed.moe.layer import MoE
    from deepspeed.utils import set_z3_leaf_modules

    torch.manual_seed(0)
    model = TinyMoEModel(ep_size=2, **KWARGS)
    if leaf:
        set_z3_leaf_modules(model, [MoE])
    config = {"train_micro_batch_size_per_gpu": MICRO, "zero_allow_untested_optimizer": True,
              "optimizer": {"type": "SGD", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3}}
    try:
        deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    except NotImplementedError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("leaf", [False, True])
def test_zero_3_with_expert_parallelism_is_refused_naming_why(dist_pool, leaf):
    for message in dist_pool.run(_refused_zero3, world_size=2, args=(leaf,)):
        assert message is not None
        assert "ZeRO stage 3 is not supported with expert parallelism" in message
        assert "MoE layer 'moe'" in message and "z3 leaf" in message


def _mixed_group():
    import deepspeed

    torch.manual_seed(0)
    model = TinyMoEModel(ep_size=2, **KWARGS)
    config = {"train_micro_batch_size_per_gpu": MICRO, "zero_allow_untested_optimizer": True,
              "optimizer": {"type": "SGD", "params": {"lr": LR}},
              "zero_optimization": {"stage": 2}}
    try:  # one param group holding dense and expert parameters
        deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    except ValueError as exc:
        return str(exc)
    return None


def test_a_param_group_mixing_experts_and_dense_weights_is_refused(dist_pool):
    for message in dist_pool.run(_mixed_group, world_size=2):
        assert message is not None and "GRADIENT_GROUP" in message
        assert "split_params_into_different_moe_groups_for_optimizer" in message


def _save_resume(save_dir, stage):
    """Train a step, save, train two more; a fresh engine loading the save and training the
    same two steps ends with the same weights (ZeRO's per-rank files hold this rank's expert
    partitions)."""
    import deepspeed
    import deepspeed.comm as dist

    data = global_batches(2, 1)
    rank = dist.get_rank()

    def build():
        torch.manual_seed(0)
        model = TinyMoEModel(ep_size=2, **KWARGS)
        config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_clipping": CLIP,
                  "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
                  "zero_optimization": {"stage": stage}, "steps_per_print": 10 ** 6}
        return deepspeed.initialize(model=model, model_parameters=moe_param_groups(model),
                                    config=config)[0]

    def train(engine, steps):
        for step in steps:
            for x, y in step[rank]:
                engine.backward(loss_of(engine, x, y))
                engine.step()

    engine = build()
    train(engine, data[:1])
    engine.save_checkpoint(save_dir, tag="t")
    train(engine, data[1:])
    expected = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    engine.destroy()
    resumed = build()
    resumed.load_checkpoint(save_dir, tag="t")
    train(resumed, data[1:])
    got = {n: p.detach().clone() for n, p in resumed.module.named_parameters()}
    resumed.destroy()
    return all(torch.equal(expected[n], got[n]) for n in expected)


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_checkpoint_resumes_at_the_same_expert_layout(dist_pool, tmp_path, stage):
    assert dist_pool.run(_save_resume, world_size=2, args=(str(tmp_path), stage)) == [True] * 2



def _engine_with_bucket(bucket):
    import deepspeed

    torch.manual_seed(0)
    model = TinyMoEModel(ep_size=2, **KWARGS)
    config = {"train_micro_batch_size_per_gpu": MICRO, "zero_allow_untested_optimizer": True,
              "optimizer": {"type": "SGD", "params": {"lr": LR}},
              "zero_optimization": {"stage": 2, "reduce_bucket_size": bucket}}
    return deepspeed.initialize(model=model, model_parameters=moe_param_groups(model),
                                config=config)[0]


def _save_then_load_with_other_buckets(save_dir):
    engine = _engine_with_bucket(10 ** 6)
    engine.save_checkpoint(save_dir, tag="t")
    engine.destroy()
    engine = _engine_with_bucket(40)  # another layout: ZeRO would re-cut the partitions
    try:
        engine.load_checkpoint(save_dir, tag="t")
    except Exception as exc:
        return str(exc)
    finally:
        engine.destroy()
    return None


def test_re_partitioning_expert_zero_checkpoints_is_refused(dist_pool, tmp_path):
    for message in dist_pool.run(_save_then_load_with_other_buckets, world_size=2,
                                 args=(str(tmp_path),)):
        assert message is not None and "cannot re-partition" in message
        assert "GRADIENT_GROUP" in message
