"""Domino trains inside the DeepSpeed engine (``deepspeed.initialize(mpu=...)`` with the
registered tensor x data parallel groups; TP 2 on 2 ranks, then TP 2 x DP 2 on 4 ranks) and
its losses equal single-process AdamW on the unsplit model; upstream's import paths resolve
to the plugin's classes."""
import pytest
import torch

from deepspeed.testing import run_distributed

STEPS, LR, TOL = 3, 1e-2, 1e-5


def _engine_on_ranks(tp):
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.utils import groups
    from domino_helpers import BATCH, batches, domino_gpt, reference_gpt

    previous = groups.mpu
    try:
        unit = groups.init_tensor_parallel_groups(tp)
        reference = reference_gpt()
        model = domino_gpt(reference)
        dp = dist.get_world_size() // tp
        micro = BATCH // dp
        config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
                  "steps_per_print": 1000,
                  "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config, mpu=unit)
        assert engine.dp_world_size == dp
        optimizer = torch.optim.AdamW(reference.parameters(), lr=LR, weight_decay=0.0)
        losses, ref_losses = [], []
        for ids in batches(STEPS):
            mine = ids[unit.dp_rank * micro:(unit.dp_rank + 1) * micro]
            loss = engine(mine)
            engine.backward(loss)
            engine.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean, group=unit.dp_group)
            losses.append(mean.item() / dp)
            ref_loss = reference(ids)
            ref_loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            ref_losses.append(ref_loss.item())
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=TOL, rtol=TOL)
        engine.destroy()
        return losses
    finally:
        groups.set_mpu(previous)


@pytest.mark.parametrize("world_size", [2, 4])
def test_domino_in_the_engine_equals_single_process_adamw(world_size):
    run_distributed(_engine_on_ranks, world_size=world_size, args=(2,), timeout=600)


def test_upstream_paths():
    import deepspeed.domino as domino
    from deepspeed.runtime.domino import DominoTransformer, DominoTransformerLayer
    from deepspeed.runtime.domino.transformer import (DominoAsyncColumnParallelLinear,
                                                      RowParallelLinearNoComm)
    from deepspeed.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    assert DominoTransformer is domino.DominoTransformer
    assert DominoTransformerLayer is domino.DominoTransformerLayer
    assert issubclass(DominoAsyncColumnParallelLinear, ColumnParallelLinear)
    assert issubclass(RowParallelLinearNoComm, RowParallelLinear)
