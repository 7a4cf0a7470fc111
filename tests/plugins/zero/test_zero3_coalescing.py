"""ZeRO-3 communicates by module and by bucket, not by parameter: a forward or backward issues at
most one all-gather per module (or prefetch), and gradients are reduce-scattered once per
``reduce_bucket_size`` run of parameters. Coalescing moves the same elements, so the result is
bit-identical to one collective per parameter and equal to single-process AdamW."""
import pytest
import torch

from tiny_models import regression_data
from zero_models import LR, MICRO

STEPS = 3


class Deep(torch.nn.Module):
    """Five modules with parameters (ten parameters, odd sizes: every shard is padded)."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(7, 13)
        self.norm = torch.nn.LayerNorm(13)
        self.mid = torch.nn.Linear(13, 11)
        self.deep = torch.nn.Linear(11, 9)
        self.out = torch.nn.Linear(9, 5)

    def forward(self, x):
        x = torch.tanh(self.norm(self.inp(x)))
        return self.out(torch.tanh(self.deep(torch.tanh(self.mid(x)))))


MODULES_WITH_PARAMETERS = 5


def _model():
    torch.manual_seed(0)
    return Deep()


def _data(world):
    return regression_data(STEPS * MICRO * world, 7, 5, seed=3)


def _reference(world, build=None):
    """Single-process AdamW over the same batches (``build``: the model; default ``_model``)."""
    model = (build or _model)()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)  # the config's default
    x, y = _data(world)
    size = MICRO * world
    for s in range(STEPS):
        batch = slice(s * size, (s + 1) * size)
        torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _train(zero):
    import deepspeed
    from deepspeed import comm as dist

    from zero_models import full_params

    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": dict({"stage": 3, "stage3_param_persistence_threshold": 0},
                                        **zero)}
    engine, *_ = deepspeed.initialize(model=_model(), config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = _data(world)
    phase = ["forward"]
    counts = {}

    def count(record):
        key = (phase[0], record.op)
        counts[key] = counts.get(key, 0) + 1

    for s in range(STEPS):
        if s == STEPS - 1:  # the module trace is recorded by the first forward
            dist.add_comm_observer(count)
        start = s * MICRO * world + rank * MICRO
        phase[0] = "forward"
        loss = torch.nn.functional.mse_loss(engine(x[start:start + MICRO]),
                                            y[start:start + MICRO])
        phase[0] = "backward"
        engine.backward(loss)
        phase[0] = "step"
        engine.step()
    dist.remove_comm_observer(count)
    runs = len(engine.optimizer.reducer.buckets)
    params = sum(1 for _ in engine.module.parameters())
    return full_params(engine.module), counts, runs, params


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("prefetch", [0, 10**6])
def test_one_all_gather_per_module_and_one_reduce_scatter_per_bucket(dist_pool, overlap,
                                                                       prefetch):
    expected = _reference(2)
    coalesced = dist_pool.run(_train, args=({"overlap_comm": overlap,
                                             "stage3_prefetch_bucket_size": prefetch},))
    per_parameter = dist_pool.run(_train, args=({"overlap_comm": overlap,
                                                 "stage3_prefetch_bucket_size": 0,
                                                 "reduce_bucket_size": 1},))
    for (params, counts, runs, n_params), (single, single_counts, single_runs, _) in \
            zip(coalesced, per_parameter):
        gathers = counts.get(("forward", "all_gather_into_tensor"), 0)
        assert 0 < gathers <= MODULES_WITH_PARAMETERS, counts
        gathers = counts.get(("backward", "all_gather_into_tensor"), 0)
        assert 0 < gathers <= MODULES_WITH_PARAMETERS, counts
        reduce_scatters = sum(v for (_, op), v in counts.items() if op == "reduce_scatter_tensor")
        assert runs == 1 and reduce_scatters == 1, counts  # the default bucket holds them all
        # reduce_bucket_size 1: one reduce-scatter per parameter, the old path's count
        assert single_runs == n_params == 10
        assert sum(v for (_, op), v in single_counts.items()
                   if op == "reduce_scatter_tensor") == n_params
        for name, want in expected.items():
            assert torch.equal(params[name], single[name]), name  # same elements, same sums
            torch.testing.assert_close(params[name], want, rtol=0, atol=1e-6, msg=name)


def test_reduce_bucket_size_bounds_each_reduce_scatter(dist_pool):
    expected = _reference(2)
    # 200 elements: runs of whole (padded) parameters, several per run, several runs
    for params, counts, runs, n_params in dist_pool.run(_train,
                                                        args=({"reduce_bucket_size": 200},)):
        reduce_scatters = sum(v for (_, op), v in counts.items() if op == "reduce_scatter_tensor")
        assert 1 < runs < n_params and reduce_scatters == runs, (runs, counts)
        for name, want in expected.items():
            torch.testing.assert_close(params[name], want, rtol=0, atol=1e-6, msg=name)


def _runs_and_sizes(bucket_size):
    import deepspeed

    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3, "reduce_bucket_size": bucket_size}}
    engine, *_ = deepspeed.initialize(model=_model(), config=config)
    return [(run.padded, len(run.params)) for run in engine.optimizer.reducer.buckets]


def test_runs_never_exceed_the_bucket_unless_one_parameter_does(dist_pool):
    for sizes in dist_pool.run(_runs_and_sizes, args=(200,)):
        assert all(padded <= 200 or count == 1 for padded, count in sizes), sizes
        assert sum(count for _, count in sizes) == 10


def _init_partitions_everything():
    import deepspeed
    from deepspeed import comm as dist

    world = dist.get_world_size()
    # the default config: a persistence threshold of 1e5 covers every parameter of Deep
    config = {"train_micro_batch_size_per_gpu": MICRO,
              "optimizer": {"type": "AdamW", "params": {"lr": LR}},
              "zero_optimization": {"stage": 3}}
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = Deep()
    params = list(model.parameters())
    built = [(p.numel(), p.ds_numel, p.ds_tensor.numel()) for p in params]
    with deepspeed.zero.GatheredParameters(params):
        inside = [p.numel() for p in params]
    after_gathered = [p.numel() for p in params]
    engine, *_ = deepspeed.initialize(model=model, config=config)
    after_initialize = [p.numel() for p in params]
    persist = [p.ds_persist for p in params]
    x = torch.randn(MICRO, 7)
    engine.backward(engine(x).pow(2).mean())
    engine.step()
    after_step = [p.numel() for p in params]
    full = [p.ds_numel for p in params]
    return world, built, inside, after_gathered, after_initialize, persist, after_step, full


def test_zero_init_partitions_every_parameter_and_persistence_starts_at_the_first_gather(
        dist_pool):
    for world, built, inside, after_gathered, after_initialize, persist, after_step, full in \
            dist_pool.run(_init_partitions_everything):
        for (numel, ds_numel, shard), size in zip(built, full):
            assert numel == 0 and ds_numel == size and shard == -(-size // world)
        assert inside == full  # whole inside the context
        assert after_gathered == [0] * len(full)  # partitioned again on exit, small ones too
        assert after_initialize == [0] * len(full)  # the engine gathers only when it needs to
        assert all(persist)  # all under the default threshold of 1e5 elements
        assert after_step == full  # persistent: resident from the first gather on


class Wide(torch.nn.Module):
    """Large enough that a whole-model reduce-scatter sends pieces of over 1 MiB per rank (gloo
    runs those as a point-to-point exchange, ``backend_ops.EXCHANGE_MIN_PIECE_BYTES``)."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(7, 1024)
        self.hidden = torch.nn.Linear(1024, 600)
        self.out = torch.nn.Linear(600, 5)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(torch.tanh(self.inp(x)))))


# 2 ranks averaging 2 micro-batch means against one mean over both: rounding differs, and Adam
# normalises every element, so an element with a near-zero gradient can move by ~lr * 1e-3
# (measured 1.5e-5 at lr 1e-2)
ATOL_WIDE = 1e-4


def _wide_model():
    torch.manual_seed(0)
    return Wide()


def _train_wide(exchange):
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.comm import backend_ops

    from zero_models import full_params

    used = []
    saved = (backend_ops.EXCHANGE_MIN_PIECE_BYTES, backend_ops._reduce_scatter_by_exchange)

    def spy(*args, **kwargs):
        used.append(args[0].numel())
        return saved[1](*args, **kwargs)

    backend_ops._reduce_scatter_by_exchange = spy
    if not exchange:
        backend_ops.EXCHANGE_MIN_PIECE_BYTES = float("inf")
    try:
        config = {"train_micro_batch_size_per_gpu": MICRO,
                  "optimizer": {"type": "AdamW", "params": {"lr": LR}},
                  "zero_optimization": {"stage": 3, "overlap_comm": True}}
        engine, *_ = deepspeed.initialize(model=_wide_model(), config=config)
        rank, world = dist.get_rank(), dist.get_world_size()
        x, y = _data(world)
        for s in range(STEPS):
            start = s * MICRO * world + rank * MICRO
            loss = torch.nn.functional.mse_loss(engine(x[start:start + MICRO]),
                                                y[start:start + MICRO])
            engine.backward(loss)
            engine.step()
        return full_params(engine.module), used
    finally:
        backend_ops.EXCHANGE_MIN_PIECE_BYTES, backend_ops._reduce_scatter_by_exchange = saved


def test_large_buckets_reduce_by_exchange_bit_identical_to_the_all_reduce_route(dist_pool):
    expected = _reference(2, _wide_model)
    exchanged = dist_pool.run(_train_wide, args=(True,))
    all_reduced = dist_pool.run(_train_wide, args=(False,))
    for (params, used), (reference, unused) in zip(exchanged, all_reduced):
        assert used and all(n * 4 >= 1 << 20 for n in used), used  # the exchange ran
        assert unused == []
        for name, want in expected.items():
            assert torch.equal(params[name], reference[name]), name
            torch.testing.assert_close(params[name], want, rtol=0, atol=ATOL_WIDE, msg=name)
