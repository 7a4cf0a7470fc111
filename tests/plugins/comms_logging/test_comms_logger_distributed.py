"""The comms logger on 2 gloo ranks: engine training steps (ZeRO 0 and 2), configure() without
an engine, stragglers, and no subscription when disabled."""
import collections
import time

import pytest
import torch

# which tensor of each spied backend op is the logged message (per-rank size, as documented)
SPIED = {"all_reduce": 0, "reduce_scatter_tensor": 0, "all_gather_into_tensor": 1}


def _spy_backend():
    """Count the bytes each backend collective really moves; returns (sizes, restore)."""
    from deepspeed.comm import backend_ops

    sizes = collections.defaultdict(collections.Counter)
    originals = {op: getattr(backend_ops, op) for op in SPIED}

    def wrap(op, fn):
        def spy(*args, **kwargs):
            tensor = args[SPIED[op]]
            sizes[op][tensor.numel() * tensor.element_size()] += 1
            return fn(*args, **kwargs)
        return spy

    for op, fn in originals.items():
        setattr(backend_ops, op, wrap(op, fn))

    def restore():
        for op, fn in originals.items():
            setattr(backend_ops, op, fn)
    return sizes, restore


def _config(stage, comms_logger):
    config = {"train_micro_batch_size_per_gpu": 2, "comms_logger": comms_logger,
              "optimizer": {"type": "Adam", "params": {"lr": 0.01}}}
    if stage:
        config["zero_optimization"] = {"stage": stage, "reduce_bucket_size": 20,
                                       "allgather_bucket_size": 20}
    return config


def _train_step(stage, via_configure):
    import deepspeed
    from deepspeed import comm as dist

    dist.observers.reset()
    before = len(dist.comm_observers())
    if via_configure:  # init_distributed(config=...) first: engine and configure share a logger
        dist.configure({"comms_logger": {"enabled": True}})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    sizes, restore = _spy_backend()
    try:
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=_config(stage, {"enabled": True}))
        subscribed = len(dist.comm_observers()) - before
        x = torch.randn(2, 5) + dist.get_rank()
        engine.backward(engine(x).pow(2).mean())
        engine.step()
        summary = dist.log_summary(return_dict=True)
    finally:
        restore()
    engine.destroy()
    dist.observers.reset()
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    logged = {op: {size: row["count"] for size, row in rows.items()}
              for op, rows in summary.items()}
    return logged, {op: dict(c) for op, c in sizes.items() if c}, subscribed, grad_bytes, summary


@pytest.mark.parametrize("stage, via_configure", [(0, False), (0, True), (2, False)],
                         ids=["stage0", "stage0-after-configure", "stage2"])
def test_engine_step_is_logged_with_the_bytes_sent(dist_pool, stage, via_configure):
    for logged, sent, subscribed, grad_bytes, summary in dist_pool.run(
            _train_step, world_size=2, args=(stage, via_configure)):
        assert subscribed == (2 if via_configure else 1)
        expected_ops = {"all_reduce"} if stage == 0 else {"reduce_scatter_tensor",
                                                          "all_gather_into_tensor"}
        assert expected_ops <= set(logged)
        for op in SPIED:
            assert logged.get(op, {}) == sent.get(op, {}), op  # every call, once, true size
        if stage == 0:
            assert sum(s * c for s, c in logged["all_reduce"].items()) >= grad_bytes
        else:  # each rank's shards of the (padded) gradients, gathered back as parameters
            assert 2 * sum(s * c for s, c in logged["reduce_scatter_tensor"].items()) >= grad_bytes
            assert 2 * sum(s * c for s, c in logged["all_gather_into_tensor"].items()) >= grad_bytes
        for rows in summary.values():
            for row in rows.values():
                assert row["avg_latency_ms"] == pytest.approx(row["total_latency_ms"] / row["count"])


def _disabled_engine():
    import deepspeed
    from deepspeed import comm as dist

    dist.observers.reset()
    model = torch.nn.Linear(3, 2)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=_config(0, {"enabled": False, "verbose": True}))
    engine.backward(engine(torch.randn(2, 3)).sum())
    engine.step()
    observed = len(dist.comm_observers())
    answer = dist.log_summary(return_dict=True)
    engine.destroy()
    return observed, engine._comm_observer, answer


def test_disabled_logger_does_not_subscribe(dist_pool):
    for observed, observer, answer in dist_pool.run(_disabled_engine, world_size=2):
        assert (observed, observer, answer) == (0, None, None)


def _without_engine(k):
    from deepspeed import comm as dist

    dist.observers.reset()
    dist.configure(enabled=True, prof_all=False, prof_ops=["all_reduce"])
    assert len(dist.comm_observers()) == 1
    small, large = torch.ones(256), torch.ones(256 * 1024)  # 1 KiB and 1 MiB of fp32
    for _ in range(k):
        dist.all_reduce(small)
        dist.all_reduce(large)
        out = torch.empty(2 * 256)
        dist.all_gather_into_tensor(out, small)  # not in prof_ops
    dist.broadcast(torch.ones(3), src=0, prof=True)  # forced by prof=True
    late = torch.ones(5)
    if dist.get_rank() == 1:
        time.sleep(0.2)  # rank 0 waits for rank 1 in the next all_reduce
    dist.all_reduce(late)
    summary = dist.log_summary(show_straggler=True, return_dict=True)
    dist.configure(enabled=False)
    remaining = len(dist.comm_observers())
    dist.observers.reset()
    return summary, remaining


def test_configure_without_engine_filters_and_measures_stragglers(dist_pool):
    k = 3
    summaries = []
    for summary, remaining in dist_pool.run(_without_engine, world_size=2, args=(k,)):
        assert remaining == 0
        assert sorted(summary) == ["all_reduce", "broadcast"]
        assert {s: r["count"] for s, r in summary["all_reduce"].items()} == \
            {1024: k, 2**20: k, 20: 1}
        assert summary["broadcast"][12]["count"] == 1
        for rows in summary.values():
            for row in rows.values():
                assert row["total_straggler_ms"] >= 0
                assert row["min_latency_ms"] <= row["max_latency_ms"]
        summaries.append(summary)
    late = [s["all_reduce"][20] for s in summaries]
    assert late[0]["total_straggler_ms"] > late[1]["total_straggler_ms"]  # rank 0 waited
    assert late[0]["max_latency_ms"] == late[1]["max_latency_ms"]
