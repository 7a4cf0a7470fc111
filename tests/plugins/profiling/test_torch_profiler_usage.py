"""The PyTorch-profiler tutorial's usage works around a DeepSpeed engine
(docs/tutorials/pytorch-profiler.md)."""
import torch

from tiny_models import mlp


def _profile_training(trace_dir):
    import deepspeed
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    engine, *_ = deepspeed.initialize(model=mlp(8, 16, 2), config={
        "train_micro_batch_size_per_gpu": 4, "wall_clock_breakdown": True,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    traces = []
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                 schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=lambda prof: traces.append(prof.key_averages())) as prof:
        for _ in range(5):
            with record_function("model_forward"):
                loss = engine(torch.randn(4, 8)).pow(2).mean()
            engine.backward(loss)
            engine.step()
            prof.step()
    names = {event.key: event.count for event in traces[0]}
    return len(traces), names.get("model_forward"), "aten::addmm" in names


def test_torch_profiler_schedule_around_engine_steps(dist_pool, tmp_path):
    ready, forwards, saw_matmul = dist_pool.run(_profile_training, world_size=1,
                                                args=(str(tmp_path),))[0]
    assert ready == 1 and forwards == 2 and saw_matmul  # the 2 active steps, once
