"""A tiny model with the awkward parts ZeRO must handle, its data, and the plain-PyTorch
reference every ZeRO test compares against.

Sizes are odd (7, 13, 5) so no bucket divides evenly by 2 or 3 ranks and padding is exercised;
``frozen`` is used in forward but not trained; ``unused`` is trained but never used (zero
gradient under ZeRO, no gradient in the reference: with weight decay 0 both leave it unchanged);
the two param groups differ in weight decay.
"""
import torch

from tiny_models import regression_data

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
    return regression_data(steps * MICRO * gas * world, 7, 5)


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
            # inputs go where the engine runs (a no-op on CPU; the GPU test's device otherwise)
            out = engine(xb.to(engine.device, dtype)).float()
            loss = torch.nn.functional.mse_loss(out, yb.to(out.device))
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


class recording_pins:
    """Within the block, every tensor the accelerator is asked to pin is remembered (by storage
    address), so a test can see that ZeRO asked for pinned masters even on an accelerator where
    pinning is a no-op (the CPU accelerator returns the tensor unchanged)."""

    def __enter__(self):
        from deepspeed.accelerator import get_accelerator

        self.accelerator = get_accelerator()
        self.addresses = set()
        pin = self.accelerator.pin_memory

        def recording(tensor, *args, **kwargs):
            pinned = pin(tensor, *args, **kwargs)
            self.addresses.add(pinned.data_ptr())
            return pinned

        self.accelerator.pin_memory = recording  # an instance attribute shadows the method
        return self

    def __exit__(self, *exc):
        del self.accelerator.pin_memory


def placement(engine, pins=None):
    """Where a ZeRO engine keeps its state, as device types: the fp32 master partitions (the
    parameters the basic optimizer steps: ``engine.optimizer.optimizer.param_groups``), their
    Adam moments, and the model's own parameters; whether the masters are pinned, whether the
    accelerator pins at all, and (given ``recording_pins`` around ``initialize``) whether pinning
    was asked for every master."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    zero = engine.optimizer
    masters = [p for group in zero.optimizer.param_groups for p in group["params"]]
    assert masters and [id(p) for p in masters] == [id(p) for p in zero.master_params()]
    assert all(p.dtype == torch.float32 for p in masters)
    moments = [zero.optimizer.state[p][key] for p in masters if p.numel()
               for key in ("exp_avg", "exp_avg_sq")]
    assert moments  # the run stepped: every non-empty master has both moments
    return {
        "engine": engine.device.type,
        "masters": {p.device.type for p in masters},
        "moments": {t.device.type for t in moments},
        "params": {p.device.type for p in engine.module.parameters()},
        "masters_pinned": all(accelerator.is_pinned(p) for p in masters if p.numel()),
        "pinning_works": accelerator.is_pinned(accelerator.pin_memory(torch.zeros(4))),
        "pin_asked": None if pins is None else
        all(p.data_ptr() in pins.addresses for p in masters if p.numel()),
    }


def assert_offloaded(where, pinned, params_offloaded=False):
    """``offload_optimizer.device: cpu``: masters and moments on the host, the model's
    parameters still on the engine's device (unless ``offload_param`` moved them too); masters
    pinned exactly when asked for and the accelerator can pin (page-locked memory needs a device
    to lock it for)."""
    assert where["masters"] == {"cpu"} and where["moments"] == {"cpu"}, where
    if not params_offloaded:
        assert where["params"] == {where["engine"]}, where
    if where["pin_asked"] is not None:
        assert where["pin_asked"] == pinned, where
    assert where["masters_pinned"] == (pinned and where["pinning_works"]), where


def assert_on_engine_device(where):
    """No offload: masters, moments and parameters all on the engine's device, none pinned."""
    device = {where["engine"]}
    assert where["masters"] == device and where["moments"] == device, where
    assert where["params"] == device, where
    assert where["pin_asked"] in (None, False) and not where["masters_pinned"], where
