"""A tiny model with the awkward parts ZeRO must handle, its data, and the plain-PyTorch
reference every ZeRO test compares against.

Sizes are odd (7, 13, 5) so no bucket divides evenly by 2 or 3 ranks and padding is exercised;
``frozen`` is used in forward but not trained; ``unused`` is trained but never used (zero
gradient under ZeRO, no gradient in the reference: with weight decay 0 both leave it unchanged);
the two param groups differ in weight decay.
"""
import torch

MICRO = 2
LR = 1e-2
CLIP = 0.5


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen = torch.nn.Linear(7, 7)
        self.a = torch.nn.Linear(7, 13)
        self.b = torch.nn.Linear(13, 5)
        self.unused = torch.nn.Linear(3, 3)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.b(torch.tanh(self.a(self.frozen(x))))


def make_model():
    torch.manual_seed(0)
    return Net()


def param_groups(model):
    return [{"params": list(model.a.parameters()) + list(model.unused.parameters()),
             "weight_decay": 0.0},
            {"params": list(model.b.parameters()), "weight_decay": 0.1}]


def make_data(steps, gas, world):
    """Inputs and targets for ``steps`` steps. Both come from one generator, so the targets
    depend on ``steps``: a test that trains in pieces must draw the data once for the total
    number of steps and slice it, not call this per piece."""
    g = torch.Generator().manual_seed(1)
    n = steps * MICRO * gas * world
    return torch.randn(n, 7, generator=g), torch.randn(n, 5, generator=g)


def micro_batch(x, y, step, micro, rank, gas, world):
    size = MICRO * gas * world
    start = step * size + rank * MICRO * gas + micro * MICRO
    return x[start:start + MICRO], y[start:start + MICRO]


def reference(steps, gas, world, clip=CLIP):
    """Single-process AdamW on the global batch: what every ZeRO run must reproduce."""
    return reference_phases([(steps, world)], gas, clip)


def reference_phases(phases, gas, clip=CLIP):
    """Like ``reference``, with the data-parallel size changing between phases
    ``[(steps, world), ...]`` (a run resumed on another number of ranks); the batches of step
    ``s`` are those ``train(..., first_step=s)`` feeds."""
    model = make_model()
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    first = 0
    for steps, world in phases:
        x, y = make_data(first + steps, gas, world)
        size = MICRO * gas * world
        for s in range(first, first + steps):
            batch = slice(s * size, (s + 1) * size)
            torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(
                    [p for p in model.parameters() if p.grad is not None], clip)
            opt.step()
            opt.zero_grad()
        first += steps
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def ds_config(stage, gas, **zero):
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
            "gradient_clipping": CLIP, "optimizer": {"type": "AdamW", "params": {"lr": LR}},
            "zero_optimization": dict({"stage": stage}, **zero)}


def train(engine, steps, gas, first_step=0):
    """Run ``steps`` optimizer steps on this rank's shard of the global batches."""
    from deepspeed import comm as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    x, y = make_data(first_step + steps, gas, world)
    dtype = engine.module.a.weight.dtype  # bf16 / fp16 runs take 16-bit inputs
    for s in range(first_step, first_step + steps):
        for m in range(gas):
            xb, yb = micro_batch(x, y, s, m, rank, gas, world)
            loss = torch.nn.functional.mse_loss(engine(xb.to(dtype)).float(), yb)
            engine.backward(loss)
            engine.step()
    return full_params(engine.module)


def full_params(module):
    """Every parameter whole, as fp32 copies (ZeRO-3 shards are gathered for the copy)."""
    out = {}
    for name, param in module.named_parameters():
        if hasattr(param, "ds_id"):
            param.all_gather()
            out[name] = param.detach().float().clone()
            param.partition()
        else:
            out[name] = param.detach().float().clone()
    return out
