"""What a real run does, in the planner's terms: bytes per collective per step (from the comms
logger) and the peak of tracked tensor memory (from the torch profiler's allocation events).

This is how the planner's numbers are checked against our engine (``tests/plugins/plan`` and
``docs/dev/benchmarks.md``). Steady state is what a plan describes, so communication is the
difference of the comms logger's summary across the last step, after the first step's one-off
traffic (ZeRO-3's first gathers) is over.
"""
import contextlib
import gc
import io

import torch


def logged_calls():
    """``{collective name: {message size: calls}}`` the comms logger recorded so far."""
    from deepspeed import comm as dist

    with contextlib.redirect_stdout(io.StringIO()):  # log_summary prints on rank 0
        summary = dist.log_summary(return_dict=True) or {}
    return {name: {size: row["count"] for size, row in by_size.items()}
            for name, by_size in summary.items()}


def calls_between(after, before):
    """The calls logged between two summaries, empty entries dropped."""
    found = {}
    for name, sizes in after.items():
        delta = {size: calls - before.get(name, {}).get(size, 0) for size, calls in sizes.items()}
        delta = {size: calls for size, calls in delta.items() if calls}
        if delta:
            found[name] = delta
    return found


def _train_step(engine, batch_fn):
    """One optimizer step. Garbage is collected first: tensors caught in reference cycles
    (autograd graphs, hooks) are otherwise freed whenever Python's collector happens to run,
    which moved the measured peak by a whole model copy from one run to the next."""
    for _ in range(engine.gradient_accumulation_steps()):
        gc.collect()
        loss = engine(batch_fn()).float().pow(2).mean()
        engine.backward(loss)
        engine.step()


_frozen_depth = 0  # open frozen_heap blocks


@contextlib.contextmanager
def frozen_heap():
    """Collect garbage, then keep what survived out of every later collection until the block
    ends (``gc.freeze``): it is alive and older than the runs inside, so the collections they
    make (one per micro-step, one before each run) walk only the objects made since. A full
    collection walks every object of torch, the engine and its plugins (~300,000): 0.2-0.5 s,
    which was most of a small validation run's time. Blocks nest: an inner one only collects
    (counted here: ``gc.get_freeze_count()`` walks the whole frozen list, ~40 ms)."""
    global _frozen_depth
    gc.collect()
    # a heap someone else froze (a test rank freezes what it inherited) stays frozen: unfreeze
    # would thaw theirs too, so then this block only collects
    owner = _frozen_depth == 0 and gc.get_freeze_count() == 0
    if owner:
        gc.freeze()
    _frozen_depth += 1
    try:
        yield
    finally:
        _frozen_depth -= 1
        if owner:
            gc.unfreeze()


def with_peak(run):
    """``(run()'s result, peak tracked tensor bytes while it ran)``. Garbage is collected
    first: an earlier run's garbage freed inside this profile would lower its level."""
    from deepspeed.testing.memory import peak_bytes

    with frozen_heap():
        peak, result = peak_bytes(run)
    return result, peak


def measure_run(build, config, batch_fn, steps=2):
    """Build the model (``build()``) and an engine from ``config`` (the comms logger switched
    on), train ``steps`` optimizer steps; return ``({collective: {message size: calls}} of
    the last step, peak tracked tensor bytes of the whole run, model construction included)``."""
    import deepspeed

    config = dict(config, comms_logger={"enabled": True, "prof_all": True})

    def run():
        model = build()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
        try:
            for _ in range(steps - 1):
                _train_step(engine, batch_fn)
            before = logged_calls()
            _train_step(engine, batch_fn)
            after = logged_calls()
        finally:
            engine.destroy()
        return calls_between(after, before)

    return with_peak(run)


def random_batch(shape, dtype=torch.float32):
    """A batch function for ``measure_run``: fresh random inputs each micro-step."""
    return lambda: torch.randn(*shape, dtype=dtype)


# The validation set: a 4-layer MLP small enough for a 2-core machine, trained in fp32 on two
# gloo ranks under each ZeRO stage, with default buckets and with buckets small enough to cut
# the model into several (and ZeRO-3 parameters both persistent and gathered).
VALIDATION_WIDTH, VALIDATION_BATCH = 256, 8
VALIDATION_CASES = {
    "stage0": {"stage": 0},
    "stage1": {"stage": 1},
    "stage2": {"stage": 2},
    "stage3": {"stage": 3},
    "stage1 small buckets": {"stage": 1, "reduce_bucket_size": 70000, "allgather_bucket_size": 50000},
    "stage2 small buckets": {"stage": 2, "reduce_bucket_size": 70000, "allgather_bucket_size": 50000},
    "stage3 gathered": {"stage": 3, "stage3_param_persistence_threshold": 300,
                        "reduce_bucket_size": 70000},
    # the optimizer on the host (here the same memory: the peak is the sum of both) and the
    # mixed-precision runs; "precision" is the case's top-level bf16/fp16 section, not a ZeRO key
    "stage2 offload cpu": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
    "stage2 bf16": {"stage": 2, "precision": "bf16"},
    "stage1 fp16": {"stage": 1, "precision": "fp16"},
}
# the cases whose peak is compared too (each run ``memory_runs`` times): every ZeRO stage with
# default buckets (at stage 3 every parameter of this model is below the persistence threshold,
# so all stay whole), and stage 3 with its weights gathered
MEMORY_CASES = ("stage0", "stage1", "stage2", "stage3", "stage3 gathered", "stage2 offload cpu",
                "stage2 bf16", "stage1 fp16")


# the engine casts the model, not its inputs: a mixed-precision case feeds its own dtype
INPUT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def validation_model():
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(VALIDATION_WIDTH, VALIDATION_WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(VALIDATION_WIDTH, 16))


def validation_config(case):
    """The DeepSpeed config of one validation case (its ZeRO section, and its precision)."""
    zero = dict(case)
    precision = zero.pop("precision", "fp32")
    config = {"train_micro_batch_size_per_gpu": VALIDATION_BATCH,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, "zero_optimization": zero}
    if precision != "fp32":
        config[precision] = {"enabled": True}
    return config


def measure_validation_set(memory_runs=5):
    """On each rank: ``{case: ({collective: {size: calls}} in the last step, [peak tracked
    bytes of each run])}``. Memory cases run ``memory_runs`` times: the peak of identical runs
    is not identical (docs/dev/benchmarks.md), so it is compared as the median of all runs of
    all ranks."""
    found = {}
    with frozen_heap():  # one full collection for the whole set, not one per run
        for name, zero in VALIDATION_CASES.items():
            runs = memory_runs if name in MEMORY_CASES else 1
            results = [measure_run(validation_model, validation_config(zero),
                                   random_batch((VALIDATION_BATCH, VALIDATION_WIDTH),
                                                INPUT_DTYPES[zero.get("precision", "fp32")]))
                       for _ in range(runs)]
            found[name] = (results[0][0], [peak for _, peak in results])
    return found


def validation_plan(zero, world_size=2):
    """What the planner predicts for one validation case: ``({collective: {size: calls}},
    MemoryPlan)``."""
    from deepspeed.plan.cluster import cluster
    from deepspeed.plan.comms import by_name_and_size, per_step
    from deepspeed.plan.layout import layout_from_config
    from deepspeed.plan.memory import memory_per_rank
    from deepspeed.plan.model_spec import from_module

    with torch.device("meta"):
        spec = from_module(validation_model(), (torch.randn(1, VALIDATION_WIDTH),), name="mlp")
    layout = layout_from_config(validation_config(zero), world_size=world_size)
    return by_name_and_size(per_step(spec, layout)), memory_per_rank(spec, layout, cluster("cpu-local"))
