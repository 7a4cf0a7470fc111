"""``deepspeed.hooks.GRADIENT_GROUP``: a parameter declaring its own process group has its
gradient summed over that group (not the data-parallel one) and divided by the data-parallel
world size, in fp32 and under bf16 with fp32 accumulation; the rest is averaged as usual."""
import pytest
import torch


def _reduce(extra):
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.hooks import GRADIENT_GROUP

    rank, world = dist.get_rank(), dist.get_world_size()
    own = [dist.new_group([r]) for r in range(world)]  # collective: every rank makes each
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    setattr(model[1].weight, GRADIENT_GROUP, own[rank])  # summed over this rank alone
    config = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD",
                                                                 "params": {"lr": 0.0}}, **extra}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    x = torch.full((2, 3), float(rank + 1)).to(next(engine.module.parameters()).dtype)
    local = torch.autograd.grad(engine.module(x).float().sum(),
                                [engine.module[0].weight, engine.module[1].weight])
    engine.backward(engine(x).float().sum())
    # the reduced gradients: on the parameters, or on their fp32 masters (fp32 accumulation)
    of_master = {id(engine.precision.model_param_of(m)): m.grad
                 for m in engine.precision.master_params()}
    grads = {name: p.grad if p.grad is not None else of_master[id(p)]
             for name, p in engine.module.named_parameters()}
    engine.destroy()
    return [g.float() for g in local], {k: v.float() for k, v in grads.items()}, world


@pytest.mark.parametrize("extra", [{}, {"bf16": {"enabled": True},
                                        "data_types": {"grad_accum_dtype": "fp32"}}],
                         ids=["fp32", "bf16-fp32-accum"])
def test_declared_group_sums_there_and_divides_by_the_data_parallel_size(dist_pool, extra):
    results = dist_pool.run(_reduce, args=(extra,))
    world = results[0][2]
    dense_mean = sum(local[0] for local, _, _ in results) / world
    for local, grads, _ in results:
        torch.testing.assert_close(grads["0.weight"], dense_mean, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(grads["1.weight"], local[1] / world, atol=1e-2, rtol=1e-2)
