"""1-bit Adam in the engine on 2 and 3 gloo ranks: warm-up is Adam on averaged gradients, the
compression stage freezes the variance, agrees on the momentum and sends no gradient
all-reduce."""
import pytest
import torch

from deepspeed.testing.distributed import run_distributed

from onebit_training import (config, data, engine, eval_loss, global_batch, identical_on_all_ranks,
                             masters, model, train)

LR = 1e-2


def _warmup(weight_decay):
    from deepspeed import comm as dist

    world, steps = dist.get_world_size(), 5
    x, y = data(steps, world)
    eng = engine(config("OneBitAdam", lr=LR, freeze_step=steps, weight_decay=weight_decay))
    history = train(eng, steps, x, y)
    ref = model()
    cls = torch.optim.AdamW if weight_decay else torch.optim.Adam
    opt = cls(ref.parameters(), lr=LR, weight_decay=weight_decay)
    for step in range(steps):
        xs, ys = global_batch(x, y, step, world)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(xs), ys).backward()
        opt.step()
    diff = max(float((a - b).abs().max()) for a, b in zip(eng.module.parameters(),
                                                          ref.parameters()))
    return diff, [[op for op, _ in ops] for _, ops in history]


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_warmup_equals_torch_adam_on_averaged_gradients(weight_decay):
    for diff, ops in run_distributed(_warmup, world_size=2, args=(weight_decay,)):
        assert diff < 1e-6
        assert all(step_ops == ["all_reduce"] for step_ops in ops)  # the engine's, full precision


def _compression():
    from deepspeed import comm as dist

    world, freeze, steps = dist.get_world_size(), 3, 9
    x, y = data(steps, world)
    mask = torch.ones(16, 1)
    mask[:4] = 0.0

    def groups(net):
        return [{"params": [net[0].weight], "exp_avg_mask": mask},
                {"params": [p for p in net.parameters() if p is not net[0].weight]}]

    eng = engine(config("OneBitAdam", lr=LR, freeze_step=freeze), model_parameters=groups)
    opt = eng.basic_optimizer
    before = eval_loss(eng, x, y)
    history = train(eng, freeze, x, y)
    frozen = [opt.state[p]["exp_avg_sq"].clone() for p in masters(eng)]
    flags = []
    history += train(eng, steps - freeze, x, y, first_step=freeze,
                     on_step=lambda s, e: flags.append(e.enable_backward_allreduce))
    exp_avgs = [opt.state[p]["exp_avg"] for p in masters(eng)]
    return {
        "variance_frozen": all(torch.equal(a, opt.state[p]["exp_avg_sq"])
                               for a, p in zip(frozen, masters(eng))),
        "momentum_identical": identical_on_all_ranks(exp_avgs),
        "params_identical": identical_on_all_ranks(list(eng.module.parameters())),
        "masked_rows": float(opt.state[masters(eng)[0]]["exp_avg"][:4].abs().max()),
        "unmasked_rows": float(opt.state[masters(eng)[0]]["exp_avg"][4:].abs().max()),
        "ops": [[op for op, _ in ops] for _, ops in history],
        "flags": flags,
        "losses": (before, eval_loss(eng, x, y)),
    }


@pytest.mark.parametrize("world", [2, 3])
def test_compression_stage(world):
    for result in run_distributed(_compression, world_size=world):
        assert result["variance_frozen"]
        assert result["momentum_identical"] and result["params_identical"]
        assert result["masked_rows"] == 0.0 and result["unmasked_rows"] > 0
        warmup, compressed = result["ops"][:3], result["ops"][3:]
        assert all(ops == ["all_reduce"] for ops in warmup)
        # no gradient all-reduce: only the momentum exchange (signs, scales, signs, scales)
        assert all(ops == ["all_to_all_single", "all_gather", "all_gather", "all_gather"]
                   for ops in compressed)
        assert result["flags"] == [False] * 6
        assert result["losses"][1] < result["losses"][0]
