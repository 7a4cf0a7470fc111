"""A tiny data-parallel training run for the monitor tests, and what it should have logged."""
import torch

MICRO = 2
GAS = 2
WARMUP_MAX_LR = 0.1


def config(**sections):
    base = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
            "optimizer": {"type": "SGD", "params": {"lr": WARMUP_MAX_LR}},
            "scheduler": {"type": "WarmupLR",
                          "params": {"warmup_min_lr": 0.0, "warmup_max_lr": WARMUP_MAX_LR,
                                     "warmup_num_steps": 4, "warmup_type": "linear"}}}
    base.update(sections)
    return base


def train(ds_config, steps):
    """Train ``steps`` optimizer steps; return what a monitor on this rank should have seen:
    per step ``(global_samples, sum of loss/gas over the step's micro-batches, lr)``."""
    import deepspeed
    from deepspeed import comm as dist

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=ds_config)
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    expected = []
    for _ in range(steps):
        loss_sum = 0.0
        for _ in range(GAS):
            x, y = torch.randn(MICRO, 4, generator=g), torch.randn(MICRO, 1, generator=g)
            x = x.to(next(engine.module.parameters()).dtype)
            loss = torch.nn.functional.mse_loss(engine(x).float(), y)
            loss_sum += loss.item() / GAS
            engine.backward(loss)
            engine.step()
        expected.append((engine.global_samples, loss_sum, engine.get_lr()[0]))
    if getattr(engine, "monitor", None) is not None:
        engine.monitor.close()
    return engine, expected
