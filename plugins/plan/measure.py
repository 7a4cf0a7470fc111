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


def _logged_bytes():
    """``{collective name: bytes}`` of everything the comms logger recorded so far."""
    from deepspeed import comm as dist

    with contextlib.redirect_stdout(io.StringIO()):  # log_summary prints on rank 0
        summary = dist.log_summary(return_dict=True) or {}
    return {name: sum(size * row["count"] for size, row in by_size.items())
            for name, by_size in summary.items()}


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
    on), train ``steps`` optimizer steps; return ``(bytes per collective in the last step,
    peak tracked tensor bytes of the whole run, model construction included)``."""
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
            before = _logged_bytes()
            _train_step(engine, batch_fn)
            after = _logged_bytes()
        finally:
            engine.destroy()
        return {name: after[name] - before.get(name, 0) for name in after
                if after[name] != before.get(name, 0)}

    gc.collect()  # an earlier run's garbage freed inside this profile would lower its level
    peak, step = peak_bytes(run)
    return step, peak


def random_batch(shape, dtype=torch.float32):
    """A batch function for ``measure_run``: fresh random inputs each micro-step."""
    return lambda: torch.randn(*shape, dtype=dtype)
