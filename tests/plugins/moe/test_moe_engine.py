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

from moe_helpers import MICRO, ep_model, global_batches, global_expert_name, loss_of, \
    moe_param_groups, train_reference

LR = 0.1


def _model_kwargs(k, drop_tokens):
    return {"num_experts": 4, "k": k, "drop_tokens": drop_tokens}


def _train(ep_size, data, gas, model_kwargs, extra=None):
    import deepspeed
    import deepspeed.comm as dist

    model, ep_rank = ep_model(ep_size, **model_kwargs)
    param_groups = moe_param_groups(model)
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
    ref_model, ref_losses, _ = train_reference(data, LR, **model_kwargs)
    expected = dict(ref_model.named_parameters())
    for losses, params, ep_rank, moe_groups in results:
        assert moe_groups == ["ep_size_2"]  # the param-group split reached the optimizer
        assert losses == pytest.approx(ref_losses, abs=1e-6)
        for name, value in params.items():
            name = global_expert_name(name, ep_rank * num_local)
            torch.testing.assert_close(value, expected[name].detach(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("k,drop_tokens", [(1, True), (1, False), (2, True), (2, False)])
def test_two_ranks_ep2_train_like_the_single_process_reference(dist_pool, k, drop_tokens):
    data = global_batches(world=2, gas=1)
    kwargs = _model_kwargs(k, drop_tokens)
    results = dist_pool.run(_train, world_size=2, args=(2, data, 1, kwargs))
    assert [r[3] for r in results] == [["ep_size_2"]] * 2
    _check(results, data, kwargs, num_local=2)


def test_four_ranks_ep2_average_experts_over_the_expert_data_parallel_group(dist_pool):
    data = global_batches(world=4, gas=2)
    kwargs = _model_kwargs(1, True)
    results = dist_pool.run(_train, world_size=4, args=(2, data, 2, kwargs))
    assert [r[2] for r in results] == [0, 1, 0, 1]
    _check(results, data, kwargs, num_local=2)


# ZeRO stages 1/2, gradient clipping, bf16/fp16 and the ZeRO-3 refusal: test_moe_zero.py

