"""Domino trains inside the DeepSpeed engine (``deepspeed.initialize`` with or without
``mpu=``: the domino plugin hands the engine the layers' tensor x data parallel groups; TP 2 on 2 ranks, then TP 2 x DP 2 on 4 ranks) and
its losses and clipped global gradient norms equal single-process AdamW on the unsplit model; upstream's import paths resolve
to the plugin's classes."""
import pytest
import torch

from deepspeed.testing import run_distributed

STEPS, LR, CLIP, TOL = 3, 1e-2, 0.05, 1e-5


def _engine_on_ranks(tp, pass_mpu):
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
                  "steps_per_print": 1000, "gradient_clipping": CLIP,
                  "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config, mpu=unit if pass_mpu else None)
        assert engine.dp_world_size == dp
        optimizer = torch.optim.AdamW(reference.parameters(), lr=LR, weight_decay=0.0)
        losses, ref_losses, norms, ref_norms = [], [], [], []
        for ids in batches(STEPS):
            mine = ids[unit.dp_rank * micro:(unit.dp_rank + 1) * micro]
            loss = engine(mine)
            engine.backward(loss)
            engine.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean, group=unit.dp_group)
            losses.append(mean.item() / dp)
            norms.append(engine.get_global_grad_norm())
            ref_loss = reference(ids)
            ref_loss.backward()
            ref_norms.append(float(torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP)))
            optimizer.step()
            optimizer.zero_grad()
            ref_losses.append(ref_loss.item())
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=TOL, rtol=TOL)
        torch.testing.assert_close(torch.tensor(norms), torch.tensor(ref_norms), atol=TOL, rtol=TOL)
        assert min(ref_norms) > CLIP  # the clip bit, so the norm had to be the global one
        engine.destroy()
        return losses
    finally:
        groups.set_mpu(previous)


@pytest.mark.parametrize("world_size, pass_mpu", [(2, False), (2, True), (4, False)])
def test_domino_in_the_engine_equals_single_process_adamw(world_size, pass_mpu):
    run_distributed(_engine_on_ranks, world_size=world_size, args=(2, pass_mpu), timeout=600)


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
