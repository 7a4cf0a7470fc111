"""Engines with the 1-bit optimizers on a tiny regression model, each rank on its own shard, and
the comm records each step produced; shared by the optimizer tests.

Every rank reads ``MICRO`` rows per step of one global batch drawn once, so a single-process
optimizer on the whole batch (mean of the ranks' mean losses) is the reference.
"""
import torch

from tiny_models import mlp, regression_data

MICRO = 4
IN, HIDDEN, OUT = 8, 16, 4


def model():
    return mlp(IN, HIDDEN, OUT, activation=torch.nn.Tanh)


def data(steps, world):
    return regression_data(steps * MICRO * world, IN, OUT)


def shard(x, y, step, rank, world):
    start = (step * world + rank) * MICRO
    return x[start:start + MICRO], y[start:start + MICRO]


def global_batch(x, y, step, world):
    start = step * world * MICRO
    return x[start:start + world * MICRO], y[start:start + world * MICRO]


def config(opt_type, precision=None, **params):
    params.setdefault("comm_backend_name", "compressed")
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "steps_per_print": 10 ** 6,
           "optimizer": {"type": opt_type, "params": params}}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    elif precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def engine(cfg, model_parameters=None, net=None):
    import deepspeed

    net = net if net is not None else model()
    params = model_parameters(net) if model_parameters else net.parameters()
    eng, *_ = deepspeed.initialize(model=net, model_parameters=params, config=cfg)
    return eng


def train(eng, steps, x, y, first_step=0, on_step=None):
    """Train ``steps`` steps; returns ``[(loss, ops)]`` with the comm ops of each step
    (``[(op, bytes)]``), counted by a ``deepspeed.comm`` observer."""
    from deepspeed import comm as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for step in range(first_step, first_step + steps):
        records = []
        dist.add_comm_observer(records.append)
        try:
            xs, ys = shard(x, y, step, rank, world)
            xs, ys = xs.to(eng.device), ys.to(eng.device)
            dtype = next(eng.module.parameters()).dtype
            loss = torch.nn.functional.mse_loss(eng(xs.to(dtype)).float(), ys)
            eng.backward(loss)
            eng.step()
        finally:
            dist.remove_comm_observer(records.append)
        out.append((float(loss.detach()), [(r.op, r.size_bytes) for r in records]))
        if on_step is not None:
            on_step(step + 1, eng)
    return out


def eval_loss(eng, x, y):
    """The model's loss on all of ``x, y`` (the same on every rank while replicas agree)."""
    with torch.no_grad():
        dtype = next(eng.module.parameters()).dtype
        out = eng.module(x.to(eng.device, dtype)).float()
        return float(torch.nn.functional.mse_loss(out, y.to(eng.device)))


def gather(tensor):
    """Every rank's copy of ``tensor``."""
    from deepspeed import comm as dist

    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return parts


def identical_on_all_ranks(tensors):
    return all(all(torch.equal(p, parts[0]) for p in parts)
               for parts in (gather(t.detach().float()) for t in tensors))


def masters(eng):
    """The fp32 tensors the basic optimizer steps, in its order."""
    return [p for g in eng.basic_optimizer.param_groups for p in g["params"]]
