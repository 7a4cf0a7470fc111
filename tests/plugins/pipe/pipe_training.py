"""A tiny pipeline run and its plain-PyTorch reference, shared by the engine tests: the same
seeded layers (``seed_layers``: layer i is built under seed ``base_seed + i``), the same
batches, ``torch.optim.AdamW``; the reference sees the whole global batch in one process."""
import torch
from torch import nn

MICRO = 2
LR = 1e-2
IN, HIDDEN, OUT = 4, 8, 3
BASE_SEED = 1234


def specs(tied=False):
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    layers = [LayerSpec(nn.Linear, IN, HIDDEN), LayerSpec(nn.Tanh),
              LayerSpec(nn.Linear, HIDDEN, HIDDEN), LayerSpec(nn.Tanh),
              LayerSpec(nn.Linear, HIDDEN, HIDDEN), LayerSpec(nn.Tanh),
              LayerSpec(nn.Linear, HIDDEN, OUT)]
    if tied:  # a square projection used first and last: its weight is shared across stages
        layers = ([TiedLayerSpec("proj", nn.Linear, IN, IN, bias=False)] + layers
                  + [TiedLayerSpec("proj", nn.Linear, IN, IN, bias=False,
                                   forward_fn=_tied_head)])
    return layers


def _tied_head(module, x):
    """The output head reuses a corner of the input projection's weight."""
    return x @ module.weight[:OUT, :OUT].t()


def mse(outputs, labels):
    """The loss in fp32 whatever the training dtype (labels stay fp32)."""
    return nn.functional.mse_loss(outputs.float(), labels.float())


def reference_model(tied=False):
    """The same layers in one ``nn.Sequential``-like module, built with the same seeds."""
    from deepspeed.pipe.layers import set_random_seed

    built, shared = [], {}
    for idx, spec in enumerate(specs(tied)):
        set_random_seed(BASE_SEED + idx)
        key = getattr(spec, "key", None)
        if key is not None and key in shared:
            built.append(_Head(shared[key]))
            continue
        module = spec.build()
        if key is not None:
            shared[key] = module
        built.append(module)
    return _Chain(built)


class _Head(nn.Module):
    def __init__(self, tied):
        super().__init__()
        self.tied = [tied]  # not registered twice

    def forward(self, x):
        return _tied_head(self.tied[0], x)


class _Chain(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def batches(count, gas, dp_world, seed=7):
    """``count`` global batches, each ``gas`` micro-batches per data-parallel rank:
    ``[[(x, y) for each micro-batch] for each dp rank]`` per batch."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        out.append([[(torch.randn(MICRO, IN, generator=g), torch.randn(MICRO, OUT, generator=g))
                     for _ in range(gas)] for _ in range(dp_world)])
    return out


OPTIMIZERS = {  # config section, reference factory; SGD sees a wrong gradient scale, Adam not
    "AdamW": ({"type": "AdamW", "params": {"lr": LR, "torch_adam": True}},
              lambda params: torch.optim.AdamW(params, lr=LR)),
    "SGD": ({"type": "SGD", "params": {"lr": 0.1}}, lambda params: torch.optim.SGD(params, lr=0.1)),
}


def config(gas, optimizer="AdamW", **extra):
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
            "optimizer": OPTIMIZERS[optimizer][0], "steps_per_print": 10 ** 6, **extra}


def reference_run(data, tied=False, clip=0.0, optimizer="AdamW"):
    """Losses per batch and the final model of the single-process reference."""
    model = reference_model(tied)
    opt = OPTIMIZERS[optimizer][1](model.parameters())
    losses = []
    for batch in data:
        opt.zero_grad()
        micro = [pair for rank in batch for pair in rank]
        total = 0.0
        for x, y in micro:
            loss = nn.functional.mse_loss(model(x), y)
            (loss / len(micro)).backward()
            total += loss.item()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(total / len(micro))
    return losses, model


def pipeline_run(num_stages, data, gas, tied=False, extra=None, module_kwargs=None,
                 optimizer="AdamW"):
    """Train the PipelineModule on ``data``; return per-batch losses and this rank's layers'
    parameters keyed by global layer index."""
    import deepspeed
    from deepspeed.pipe import PipelineModule

    model = PipelineModule(specs(tied), num_stages=num_stages, loss_fn=mse,
                           seed_layers=True, base_seed=BASE_SEED, partition_method="uniform",
                           **(module_kwargs or {}))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config(gas, optimizer, **(extra or {})))
    dp_rank = engine.grid.get_data_parallel_rank()
    losses = []
    for batch in data:
        losses.append(engine.train_batch(iter(batch[dp_rank])).item())
    params = {}
    for name, param in engine.module.named_parameters():
        params[name] = param.detach().float().clone()
    info = (type(engine).__name__, engine.stage_id, engine.is_first_stage(),
            engine.is_last_stage())
    engine.destroy()
    return losses, params, info
