"""An MoE model trained through ``deepspeed.initialize`` with expert parallelism equals the
single-process reference holding every expert, trained with plain SGD on the global batch.

Routing is per rank (each rank gates its own micro-batch, with a capacity from its own token
count), so the reference runs each rank's shard through the model separately and averages the
shards' losses: the mean loss over the global batch, with the same routing. The engine's side
of the arithmetic: an expert's gradient on a rank already sums every rank's tokens routed to
it (the backward all-to-all brings them), is summed over the expert-data-parallel group (the
ranks holding the same expert) and divided by the data-parallel world size like every
gradient, which gives the global mean."""
import pytest
import torch

from moe_helpers import TinyMoEModel, loss_of, model_params_from_reference

STEPS, MICRO, LR, IN, OUT = 3, 6, 0.1, 4, 3


def _model_kwargs(k, drop_tokens):
    return {"num_experts": 4, "k": k, "drop_tokens": drop_tokens}


def _data(world, gas, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [[[(torch.randn(MICRO, IN, generator=g), torch.randn(MICRO, OUT, generator=g))
              for _ in range(gas)] for _ in range(world)] for _ in range(STEPS)]


def _reference(data, model_kwargs):
    torch.manual_seed(0)
    model = TinyMoEModel(ep_size=1, **model_kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in data:
        shards = [pair for rank in step for pair in rank]
        opt.zero_grad()
        total = 0.0
        for x, y in shards:
            loss = loss_of(model, x, y)
            (loss / len(shards)).backward()
            total += loss.item()
        opt.step()
        losses.append(total / len(shards))
    return losses, model


def _train(ep_size, data, gas, model_kwargs, extra=None):
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    from deepspeed.utils import groups

    torch.manual_seed(0)
    reference = TinyMoEModel(ep_size=1, **model_kwargs)
    model = TinyMoEModel(ep_size=ep_size, **model_kwargs)
    ep_rank = groups._get_expert_parallel_rank(model.moe.expert_group_name)
    model_params_from_reference(model, reference, ep_rank)
    param_groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "parameters"})
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
              "optimizer": {"type": "SGD", "params": {"lr": LR}}, "steps_per_print": 10 ** 6,
              **(extra or {})}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups, config=config)
    rank = dist.get_rank()
    losses = []
    for step in data:
        total = 0.0
        for x, y in step[rank]:
            loss = loss_of(engine, x, y)
            engine.backward(loss)
            engine.step()
            total += loss.item()
        summed = torch.tensor([total])
        dist.all_reduce(summed)
        losses.append(summed.item() / (len(step) * gas))
    params = {name: p.detach().clone() for name, p in engine.module.named_parameters()}
    moe_groups = [g.get("name") for g in engine.basic_optimizer.param_groups if g.get("moe")]
    engine.destroy()
    return losses, params, ep_rank, moe_groups


def _check(results, data, model_kwargs, num_local):
    ref_losses, ref_model = _reference(data, model_kwargs)
    expected = dict(ref_model.named_parameters())
    prefix = "moe.deepspeed_moe.experts.deepspeed_experts."
    for losses, params, ep_rank, moe_groups in results:
        assert moe_groups == ["ep_size_2"]  # the param-group split reached the optimizer
        assert losses == pytest.approx(ref_losses, abs=1e-6)
        for name, value in params.items():
            if name.startswith(prefix):
                local, rest = name[len(prefix):].split(".", 1)
                name = f"{prefix}{ep_rank * num_local + int(local)}.{rest}"
            torch.testing.assert_close(value, expected[name].detach(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("k,drop_tokens", [(1, True), (1, False), (2, True), (2, False)])
def test_two_ranks_ep2_train_like_the_single_process_reference(dist_pool, k, drop_tokens):
    data = _data(world=2, gas=1)
    kwargs = _model_kwargs(k, drop_tokens)
    results = dist_pool.run(_train, world_size=2, args=(2, data, 1, kwargs))
    assert [r[3] for r in results] == [["ep_size_2"]] * 2
    _check(results, data, kwargs, num_local=2)


def test_four_ranks_ep2_average_experts_over_the_expert_data_parallel_group(dist_pool):
    data = _data(world=4, gas=2)
    kwargs = _model_kwargs(1, True)
    results = dist_pool.run(_train, world_size=4, args=(2, data, 2, kwargs))
    assert [r[2] for r in results] == [0, 1, 0, 1]
    _check(results, data, kwargs, num_local=2)


# ZeRO stages 1/2, gradient clipping, bf16/fp16 and the ZeRO-3 refusal: test_moe_zero.py

