"""`stage3_max_reuse_distance`: a ZeRO-3 parameter used again soon stays gathered. Activation
checkpointing re-runs each block's forward right before its backward, and a block called twice
in one forward needs its weights again after only the modules in between; with a large
distance neither is gathered twice, with 0 both are. Numerics never change."""
import pytest
import torch
import torch.utils.checkpoint

LR = 1e-2
MICRO = 2
STEPS = 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(3)])
        self.shared = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(lambda t, b=block: torch.tanh(b(t)), x,
                                                  use_reentrant=False)
        x = torch.tanh(self.shared(x))
        x = torch.tanh(self.shared(x * 0.5))  # called again; no other module ran in between
        return self.head(x)


def _model():
    torch.manual_seed(0)
    return Net()


def _data(world):
    g = torch.Generator().manual_seed(4)
    return torch.randn(STEPS * MICRO * world, 8, generator=g)


def _reference(world):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    x = _data(world)
    size = MICRO * world
    for s in range(STEPS):
        model(x[s * size:(s + 1) * size]).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _train(distance):
    import deepspeed
    from deepspeed import comm as dist

    from zero_models import full_params

    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "stage3_prefetch_bucket_size": 0,
                                    "stage3_max_reuse_distance": distance}}
    engine, *_ = deepspeed.initialize(model=_model(), config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    x = _data(world)
    gathers = []

    def count(record):
        if record.op == "all_gather_into_tensor":
            gathers.append(record)

    for s in range(STEPS):
        if s == STEPS - 1:  # the trace is recorded by the first forward
            dist.add_comm_observer(count)
        start = s * MICRO * world + rank * MICRO
        engine.backward(engine(x[start:start + MICRO]).pow(2).mean())
        engine.step()
    dist.remove_comm_observer(count)
    placeholders = all(p.numel() == 0 for p in engine.module.parameters())
    return full_params(engine.module), len(gathers), placeholders


def test_reuse_distance_saves_gathers_without_changing_numerics(dist_pool):
    expected = _reference(2)
    runs = {d: dist_pool.run(_train, args=(d,)) for d in (0, 10**9)}
    for distance, results in runs.items():
        for params, _, placeholders in results:
            assert placeholders, distance  # everything is released by the end of the step
            for name, want in expected.items():
                torch.testing.assert_close(params[name], want, rtol=0, atol=1e-6,
                                           msg=f"{name} at distance {distance}")
    never, always = runs[0][0][1], runs[10**9][0][1]
    # one all-gather per module (weight and bias together). Distance 0: each block forward,
    # re-run and backward (3 x 3); shared twice in forward, once in backward (its gradient is
    # taken after both calls' backward, so it stays whole between them); head forward and
    # backward
    assert never == 3 * 3 + 2 + 1 + 2
    # large: the re-run keeps each block whole for its backward, and shared stays whole
    # between its two forward calls
    assert always == 3 * 2 + 1 + 1 + 2
