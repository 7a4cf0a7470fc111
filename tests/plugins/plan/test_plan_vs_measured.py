"""The planner against real 2-rank runs of our engine on this machine: bytes per collective
per step equal the comms logger's exactly (ZeRO stages 0-3, default and small buckets, mixed
persistent/gathered ZeRO-3 parameters), and the predicted peak is within 15% of the measured
peak of tracked tensor memory. One pool run trains every layout; the tests read its result."""
import pytest
import torch

from deepspeed.plan import Layout, by_name, cluster, from_module, layout_from_config, memory_per_rank, per_step

WIDTH, BATCH = 256, 8

# (name, zero_optimization section): each measured for communication; memory where marked
CASES = [
    ("stage0", {"stage": 0}),
    ("stage1", {"stage": 1}),
    ("stage2", {"stage": 2}),
    ("stage3", {"stage": 3}),
    ("stage1 small buckets", {"stage": 1, "reduce_bucket_size": 70000, "allgather_bucket_size": 50000}),
    ("stage2 small buckets", {"stage": 2, "reduce_bucket_size": 70000, "allgather_bucket_size": 50000}),
    ("stage3 gathered", {"stage": 3, "stage3_param_persistence_threshold": 300,
                         "reduce_bucket_size": 70000}),
]
# ZeRO-3 frees a partitioned parameter's storage in place, which the profiler's allocation
# events do not balance, so its tracked level cannot be read this way (docs/dev/benchmarks.md)
MEMORY_CASES = ["stage0", "stage1", "stage2"]


def build():
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 16))


def config_of(zero):
    return {"train_micro_batch_size_per_gpu": BATCH,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, "zero_optimization": zero}


def _measure_all():
    """{case: (bytes per collective in the last step, peak tracked bytes)}; the memory cases
    run three times and report the median peak: the profiler's CPU timeline now and then
    shows a model-sized spike that the next run of the same code does not (events of the
    autograd and gloo threads ordered by their timestamps), docs/dev/benchmarks.md."""
    import statistics

    from deepspeed.plan.measure import measure_run, random_batch

    found = {}
    for name, zero in CASES:
        runs = 3 if name in MEMORY_CASES else 1
        results = [measure_run(build, config_of(zero), random_batch((BATCH, WIDTH)))
                   for _ in range(runs)]
        found[name] = (results[0][0], statistics.median(peak for _, peak in results))
    return found


@pytest.fixture(scope="module")
def measured(dist_pool):
    return dist_pool.run(_measure_all, world_size=2)


def predicted(zero):
    with torch.device("meta"):
        module = build()
        spec = from_module(module, (torch.randn(1, WIDTH),), name="mlp")
    layout = layout_from_config(config_of(zero), world_size=2)
    hw = cluster("cpu-local")
    return by_name(per_step(spec, layout)), memory_per_rank(spec, layout, hw), layout


@pytest.mark.parametrize("name", [name for name, _ in CASES])
def test_bytes_per_collective_equal_the_comms_logger(measured, name):
    expected, _, _ = predicted(dict(CASES)[name])
    for rank, results in enumerate(measured):
        logged, _ = results[name]
        assert logged == expected, f"rank {rank} {name}: logged {logged}, planned {expected}"


@pytest.mark.parametrize("name", MEMORY_CASES)
def test_peak_memory_within_15_percent(measured, name):
    _, plan, _ = predicted(dict(CASES)[name])
    for rank, results in enumerate(measured):
        _, peak = results[name]
        assert abs(plan.peak - peak) <= 0.15 * peak, \
            f"rank {rank} {name}: measured {peak}, planned {plan.peak} ({plan})"


def test_layout_reads_the_config():
    _, _, layout = predicted({"stage": 2, "reduce_bucket_size": 70000})
    assert layout == Layout(dp=2, zero_stage=2, micro_batch=BATCH, precision="fp32",
                            reduce_bucket_size=70000)
