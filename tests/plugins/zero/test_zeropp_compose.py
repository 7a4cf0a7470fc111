"""ZeRO++ composed with the rest of ZeRO-3 (gradient accumulation + clipping, bf16 / fp16,
parameter offload to the CPU, checkpoints), and the combinations refused at ``initialize``."""
import pytest
import torch

from zeropp_gpt import MICRO, config, make_gpt, tokens, train

ALL = {"zero_quantized_weights": True, "zero_hpz_partition_size": 2,
       "zero_quantized_gradients": True}
NODES = {"LOCAL_WORLD_SIZE": "2"}


def _max_relative(runs, base):
    return max(abs(a - b) / abs(b) for run, ref in zip(runs, base) for a, b in zip(run, ref))


@pytest.mark.parametrize("kwargs, extra", [
    ({"gas": 2, "clip": 0.5}, {}),
    ({"dtype": "fp16"}, {}),
    ({}, {"offload_param": {"device": "cpu"}}),
    ({}, {"offload_optimizer": {"device": "cpu"}}),
], ids=["accumulation+clipping", "fp16", "offload_param", "offload_optimizer"])
def test_all_flags_compose(dist_pool, kwargs, extra):
    base = dist_pool.run(train, world_size=4, args=(extra, 10), kwargs=kwargs, env=NODES)
    runs = dist_pool.run(train, world_size=4, args=({**ALL, **extra}, 10), kwargs=kwargs,
                         env=NODES)
    assert _max_relative([r[0] for r in runs], [r[0] for r in base]) < 0.12
    assert runs[0][0][-1] < 0.5 * runs[0][0][0]


def _resume(tmp, extra):
    """Train 3 steps, save, 2 more (losses A); a new engine loads and trains 2 (losses B)."""
    import deepspeed
    from deepspeed import comm as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    idx, tgt = tokens(5, world)

    def run(engine, steps):
        out = []
        for step in steps:
            at = (step * world + rank) * MICRO
            loss = engine(idx[at:at + MICRO], tgt[at:at + MICRO])
            engine.backward(loss)
            engine.step()
            out.append(loss.item())
        return out

    def build():
        model = make_gpt()
        return deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                    config=config(extra))[0]

    engine = build()
    run(engine, range(3))
    engine.save_checkpoint(tmp, tag="t")
    first = run(engine, range(3, 5))
    engine.destroy()
    engine = build()
    engine.load_checkpoint(tmp, tag="t")
    second = run(engine, range(3, 5))
    engine.destroy()
    return first, second


def test_checkpoint_resume_continues_exactly(dist_pool, tmp_path):
    for first, second in dist_pool.run(_resume, world_size=4, args=(str(tmp_path), ALL),
                                       env=NODES):
        assert first == second


# ---------------------------------------------------------------------- refusals
def _check(zero, world=4):
    from deepspeed.zero.config import DeepSpeedZeroConfig
    from deepspeed.zero.zeropp.setup import check_zeropp

    check_zeropp(DeepSpeedZeroConfig(**zero), world)


@pytest.mark.parametrize("zero, message", [
    ({"stage": 2, "zero_quantized_weights": True}, "zero_quantized_weights .*stage to 3"),
    ({"stage": 1, "zero_hpz_partition_size": 2}, "zero_hpz_partition_size .*stage to 3"),
    ({"stage": 3, "zero_hpz_partition_size": 3}, "zero_hpz_partition_size=3 must divide .* 4"),
    ({"stage": 3, "zero_hpz_partition_size": 8}, "zero_hpz_partition_size=8 must divide"),
    ({"stage": 3, "zero_quantized_gradients": True, "reduce_scatter": False},
     "reduce_scatter is false"),
    ({"stage": 3, "zero_quantized_weights": True, "mics_shard_size": 2},
     "cannot be combined with mics_shard_size=2"),
    ({"stage": 3, "zero_quantized_nontrainable_weights": True,
      "offload_param": {"device": "nvme", "nvme_path": "/tmp"}}, "nvme"),
])
def test_impossible_combinations_are_refused_with_the_keys_named(zero, message):
    with pytest.raises(ValueError, match=message):
        _check(zero)


def test_defaults_and_plain_stage3_pass():
    _check({"stage": 3})
    _check({"stage": 2, "zero_hpz_partition_size": 1})
    _check({"stage": 3, "zero_hpz_partition_size": 4, "zero_quantized_gradients": True})


def _initialize_refused():
    import deepspeed

    model = torch.nn.Linear(4, 4)
    try:
        deepspeed.initialize(model=model, model_parameters=model.parameters(),
                             config=config({"zero_hpz_partition_size": 3}))
    except ValueError as exc:
        return str(exc)
    return None


def test_initialize_refuses_before_partitioning(dist_pool):
    for message in dist_pool.run(_initialize_refused, world_size=2):
        assert message is not None and "zero_hpz_partition_size=3" in message
