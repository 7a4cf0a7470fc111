"""AutoTP training on gloo ranks equals single-process training of the unsplit model:
``tp_model_init(tp_size=2)`` on 2 ranks (TP 2) and on 4 ranks (TP 2 x DP 2, ZeRO-1 and
ZeRO-2) train a tiny Llama with AdamW and a gradient clip that bites, and every step's loss
(averaged over the data-parallel ranks), the global gradient norm and the gathered weights
(``_consolidated_16bit_state_dict``, ``save_16bit_model``) equal the reference's to 1e-5.
``engine.deepspeed_io`` feeds the ranks of a tensor-parallel group the same samples."""
import os

import pytest
import torch

from deepspeed.testing import run_distributed

pytest.importorskip("transformers")

STEPS, LR, CLIP, TOL = 3, 1e-2, 0.05, 1e-5


def _close(got, want):
    torch.testing.assert_close(got, want, atol=TOL, rtol=TOL)


def _train_tp(tp, zero_stage, save_dir):
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from tp_train_helpers import (MICRO, dp_mean, ds_config, global_batches, registered_groups_restored,
                                  tiny_llama, train_reference)

    with registered_groups_restored():
        model = tiny_llama()
        dp = dist.get_world_size() // tp
        batches = global_batches(STEPS, dp)
        ref_losses, ref_norms, ref_state = train_reference(model, batches, LR, CLIP)
        full_shapes = {k: v.shape for k, v in model.state_dict().items()}

        model = deepspeed.tp_model_init(model, tp_size=tp, dtype=torch.float32)
        attn = model.model.layers[0].self_attn
        assert isinstance(attn.q_proj, ColumnParallelLinear) and attn.q_proj.out_features == 32 // tp
        assert isinstance(attn.k_proj, ColumnParallelLinear) and attn.k_proj.out_features == 16 // tp
        assert isinstance(attn.o_proj, RowParallelLinear) and attn.o_proj.in_features == 32 // tp
        assert isinstance(model.model.layers[1].mlp.down_proj, RowParallelLinear)
        engine, *_ = deepspeed.initialize(model=model, config=ds_config(tp, zero_stage, LR, CLIP),
                                          model_parameters=model.parameters())
        assert engine.dp_world_size == dp and engine.mpu.get_model_parallel_world_size() == tp
        assert engine.zero_gather_16bit_weights_on_model_save()
        dp_rank = engine.mpu.get_data_parallel_rank()
        # the engine's loader gives the ranks of a tensor-parallel group the same samples
        loader = engine.deepspeed_io(torch.arange(16 * dp).float().view(-1, 1))
        seen = [None] * dist.get_world_size()
        dist.all_gather_object(seen, next(iter(loader)).flatten().tolist())
        assert seen == [seen[(r // tp) * tp] for r in range(len(seen))]
        assert len({tuple(s) for s in seen}) == dp
        losses, norms = [], []
        for ids in batches:
            mine = ids[dp_rank * MICRO:(dp_rank + 1) * MICRO]
            loss = engine(input_ids=mine, labels=mine).loss
            engine.backward(loss)
            engine.step()
            losses.append(dp_mean(loss.item(), engine.dp_group))
            norms.append(engine.get_global_grad_norm())
        _close(torch.tensor(losses), torch.tensor(ref_losses))
        _close(torch.tensor(norms), torch.tensor(ref_norms))
        assert min(ref_norms) > CLIP  # the clip did bite, so its norm had to be the global one

        gathered = engine._consolidated_16bit_state_dict()
        engine.save_16bit_model(save_dir, "tp.bin")
        if dist.get_rank() == 0:
            assert {k: v.shape for k, v in gathered.items()} == full_shapes
            for name, value in ref_state.items():
                _close(gathered[name], value)
            saved = torch.load(os.path.join(save_dir, "tp.bin"), weights_only=True)
            assert saved.keys() == ref_state.keys()
            for name, value in ref_state.items():
                _close(saved[name], value)
        else:
            assert gathered is None
        engine.destroy()
        return losses


def test_tp2_on_two_ranks_equals_single_process(tmp_path):
    losses = run_distributed(_train_tp, world_size=2, args=(2, 0, str(tmp_path)), timeout=180)
    assert losses[0] == losses[1]


@pytest.mark.parametrize("zero_stage", [1, 2])
def test_tp2_dp2_with_zero_equals_single_process(tmp_path, zero_stage):
    run_distributed(_train_tp, world_size=4, args=(2, zero_stage, str(tmp_path)), timeout=240)


def _bf16_first_step(tp):
    import deepspeed
    from tp_train_helpers import ds_config, global_batches, registered_groups_restored, \
        tiny_llama, train_reference

    with registered_groups_restored():
        model = tiny_llama()
        batches = global_batches(1, 1)
        ref_losses, ref_norms, _ = train_reference(model, batches, LR, CLIP)
        model = deepspeed.tp_model_init(model, tp_size=tp, dtype=torch.bfloat16)
        assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
        engine, *_ = deepspeed.initialize(model=model, config=ds_config(
            tp, 1, LR, CLIP, bf16={"enabled": True}), model_parameters=model.parameters())
        ids = batches[0]
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        gathered = engine._consolidated_16bit_state_dict()
        if gathered is not None:
            assert gathered["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
            assert gathered["model.layers.0.mlp.up_proj.weight"].shape == (64, 32)
        engine.destroy()
        return loss.item(), engine.get_global_grad_norm(), ref_losses[0], ref_norms[0]


def test_bf16_with_zero1_measures_the_global_norm():
    # bf16 weights and activations: the first step's loss and gradient norm are the fp32
    # reference's to bf16 precision (a norm counting the replicated weights twice, or missing
    # the other rank's shards, would be off by far more)
    for loss, norm, ref_loss, ref_norm in run_distributed(_bf16_first_step, world_size=2,
                                                          args=(2,), timeout=180):
        assert abs(loss - ref_loss) < 2e-2 * ref_loss
        assert abs(norm - ref_norm) < 2e-2 * ref_norm
