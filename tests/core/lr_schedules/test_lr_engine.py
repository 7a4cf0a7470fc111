"""A config `scheduler` section drives the engine's optimizer on 2 gloo ranks: the schedule steps
once per optimizer step (accumulation boundary), not once per micro-batch."""
import pytest
import torch

GAS, BOUNDARY_STEPS, WARMUP, MAX_LR = 2, 6, 4, 0.01


def _train_with_config_scheduler():
    import deepspeed

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    engine, opt, _, sched = deepspeed.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": GAS,
        "optimizer": {"type": "Adam", "params": {"lr": 0.5}},
        "scheduler": {"type": "WarmupLR", "params": {
            "warmup_min_lr": 0, "warmup_max_lr": MAX_LR, "warmup_num_steps": WARMUP,
            "warmup_type": "linear"}}})
    lrs = []
    for _ in range(BOUNDARY_STEPS * GAS):
        loss = engine(torch.ones(1, 4)).sum()
        engine.backward(loss)
        engine.step()
        lrs.append(opt.param_groups[0]["lr"])
    return type(sched).__name__, sched.last_batch_iteration, lrs


def test_config_scheduler_steps_at_accumulation_boundaries(dist_pool):
    for name, last, lrs in dist_pool.run(_train_with_config_scheduler):
        assert name == "WarmupLR" and last == BOUNDARY_STEPS - 1
        expected = [MAX_LR * min(1.0, i / WARMUP) for i in range(BOUNDARY_STEPS)]
        # micro-step 2k (no boundary) keeps the previous lr; micro-step 2k+1 applies step k
        assert lrs[1::GAS] == pytest.approx(expected, abs=1e-15)
        assert lrs[2::GAS] == pytest.approx(expected[:-1], abs=1e-15)
        assert lrs[0] == 0.5  # before the first boundary the constructor left the lr alone
