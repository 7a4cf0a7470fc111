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


def _logged_calls():
    """``{collective name: {message size: calls}}`` the comms logger recorded so far."""
    from deepspeed import comm as dist

    with contextlib.redirect_stdout(io.StringIO()):  # log_summary prints on rank 0
        summary = dist.log_summary(return_dict=True) or {}
    return {name: {size: row["count"] for size, row in by_size.items()}
            for name, by_size in summary.items()}


def _difference(after, before):
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


def measure_run(build, config, batch_fn, steps=2):
    """Build the model (``build()``) and an engine from ``config`` (the comms logger switched
    on), train ``steps`` optimizer steps; return ``({collective: {message size: calls}} of
    the last step, peak tracked tensor bytes of the whole run, model construction included)``."""
    import deepspeed
    from deepspeed.testing.memory import peak_bytes

    config = dict(config, comms_logger={"enabled": True, "prof_all": True})

    def run():
        model = build()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
        try:
            for _ in range(steps - 1):
                _train_step(engine, batch_fn)
            before = _logged_calls()
            _train_step(engine, batch_fn)
            after = _logged_calls()
        finally:
            engine.destroy()
        return _difference(after, before)

    gc.collect()  # an earlier run's garbage freed inside this profile would lower its level
    peak, step = peak_bytes(run)
    return step, peak


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
}
# ZeRO-3 frees a partitioned parameter's storage in place, which the profiler's allocation
# events do not balance, so its tracked level cannot be read this way
MEMORY_CASES = ("stage0", "stage1", "stage2")


def validation_model():
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(VALIDATION_WIDTH, VALIDATION_WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(VALIDATION_WIDTH, 16))


def validation_config(zero):
    return {"train_micro_batch_size_per_gpu": VALIDATION_BATCH,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, "zero_optimization": zero}


PIPELINE_MICRO, PIPELINE_ACCUM, PIPELINE_HIDDEN = 2, 3, 32


def pipeline_layers():
    from deepspeed.pipe import LayerSpec

    width = PIPELINE_HIDDEN
    return [LayerSpec(torch.nn.Linear, 16, width), LayerSpec(torch.nn.Tanh),
            LayerSpec(torch.nn.Linear, width, width), LayerSpec(torch.nn.Tanh),
            LayerSpec(torch.nn.Linear, width, 4)]


def measure_pipeline(steps=2):
    """``{collective: {size: calls}}`` of the last ``train_batch`` of a two-stage pipeline
    (``PIPELINE_ACCUM`` micro-batches of ``PIPELINE_MICRO`` samples, fp32)."""
    import deepspeed
    from deepspeed.pipe import PipelineModule

    torch.manual_seed(0)
    model = PipelineModule(pipeline_layers(), num_stages=2, loss_fn=torch.nn.MSELoss())
    config = {"train_micro_batch_size_per_gpu": PIPELINE_MICRO,
              "gradient_accumulation_steps": PIPELINE_ACCUM,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
              "comms_logger": {"enabled": True, "prof_all": True}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                      config=config)

    def batches():
        while True:
            yield torch.randn(PIPELINE_MICRO, 16), torch.randn(PIPELINE_MICRO, 4)

    data = batches()
    try:
        for _ in range(steps - 1):
            engine.train_batch(data)  # the first step also sends the activations' shapes
        before = _logged_calls()
        engine.train_batch(data)
        return _difference(_logged_calls(), before)
    finally:
        engine.destroy()


def pipeline_plan():
    """The planner's ``{collective: {size: calls}}`` for ``measure_pipeline``: the hidden
    width crossing the stage boundary is the model's, one token per sample."""
    from deepspeed.plan.comms import by_name_and_size, per_step
    from deepspeed.plan.layout import Layout
    from deepspeed.plan.model_spec import from_module

    with torch.device("meta"):
        module = torch.nn.Sequential(*(spec.build() for spec in pipeline_layers()))
        spec = from_module(module, (torch.randn(1, 16),), name="pipe-mlp", num_layers=2,
                           hidden_size=PIPELINE_HIDDEN, seq_len=1)
    layout = Layout(dp=1, pp=2, micro_batch=PIPELINE_MICRO, grad_accum=PIPELINE_ACCUM,
                    precision="fp32")
    return by_name_and_size(per_step(spec, layout))


TP_LLAMA = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=32, attention_bias=False, mlp_bias=False)
TP_MICRO, TP_SEQ = 2, 8


def measure_tensor_parallel(steps=2):
    """``{collective: {size: calls}}`` of the last step of a tiny Llama split over two
    tensor-parallel ranks by ``deepspeed.tp_model_init`` (fp32)."""
    import deepspeed
    from deepspeed.utils import groups
    from transformers import AutoModelForCausalLM

    from deepspeed.plan.model_spec import hf_config

    previous = groups.mpu  # tp_model_init registers its unit process-wide: put it back
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(hf_config(TP_LLAMA)).float()
        model = deepspeed.tp_model_init(model, tp_size=2, dtype=torch.float32)
        config = {"train_micro_batch_size_per_gpu": TP_MICRO,
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                  "tensor_parallel": {"autotp_size": 2},
                  "comms_logger": {"enabled": True, "prof_all": True}}
        engine, *_ = deepspeed.initialize(model=model, config=config,
                                          model_parameters=model.parameters())
        try:
            for step in range(steps):
                ids = torch.randint(0, TP_LLAMA["vocab_size"], (TP_MICRO, TP_SEQ))
                before = _logged_calls()
                engine.backward(engine(input_ids=ids, labels=ids).loss)
                engine.step()
            return _difference(_logged_calls(), before)
        finally:
            engine.destroy()
    finally:
        groups.set_mpu(previous)


def tensor_parallel_plan():
    """The planner's ``{collective: {size: calls}}`` for ``measure_tensor_parallel``."""
    from deepspeed.plan.comms import by_name_and_size, per_step
    from deepspeed.plan.layout import Layout
    from deepspeed.plan.model_spec import from_transformers

    spec = from_transformers(TP_LLAMA, seq_len=TP_SEQ)
    layout = Layout(dp=1, tp=2, micro_batch=TP_MICRO, precision="fp32")
    return by_name_and_size(per_step(spec, layout))


def measure_validation_set(memory_runs=3):
    """On each rank: ``{case: ({collective: {size: calls}} in the last step, peak tracked
    bytes)}``.
    Memory cases run ``memory_runs`` times and report the median peak: the profiler's CPU
    timeline now and then shows a model-sized spike that the next run of the same code does
    not (events of the autograd and gloo threads ordered by their timestamps)."""
    import statistics

    found = {}
    for name, zero in VALIDATION_CASES.items():
        runs = memory_runs if name in MEMORY_CASES else 1
        results = [measure_run(validation_model, validation_config(zero),
                               random_batch((VALIDATION_BATCH, VALIDATION_WIDTH)))
                   for _ in range(runs)]
        found[name] = (results[0][0], statistics.median(peak for _, peak in results))
    found["pipeline pp2"] = (measure_pipeline(), None)
    found["tensor tp2"] = (measure_tensor_parallel(), None)
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
