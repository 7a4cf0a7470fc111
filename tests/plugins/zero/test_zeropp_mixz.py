"""MixZ++ on 2 gloo ranks: frozen base weights stored as int8 (about 1/4 of fp32), forward
within 1% of the unquantized model, the trainable (LoRA-style) part still trains, and
``optimizer.quantize_nontrainable_params()`` for weights frozen after ``initialize``."""
import torch

from zeropp_gpt import MICRO, config, make_gpt, tokens

MIXZ = {"zero_quantized_nontrainable_weights": True}


def _frozen_facts(engine):
    from deepspeed.zero.zeropp.mixz import is_stored_quantized, stored_bytes

    frozen = [p for p in engine.module.parameters() if not p.requires_grad]
    quantized = [p for p in frozen if is_stored_quantized(p)]
    fp32 = sum(p.ds_quantized_numel * 4 for p in quantized)
    return len(frozen), len(quantized), sum(stored_bytes(p) for p in quantized) / max(fp32, 1)


def _mixz_worker(extra):
    import deepspeed
    from deepspeed import comm as dist

    model = make_gpt(freeze_base=True)
    reference = make_gpt(freeze_base=True)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=config({**MIXZ, **extra}))
    frozen, quantized, ratio = _frozen_facts(engine)
    world, rank = dist.get_world_size(), dist.get_rank()
    idx, tgt = tokens(10, world)
    first = slice(rank * MICRO, (rank + 1) * MICRO)
    with torch.no_grad():
        error = abs(engine(idx[first], tgt[first]).item()
                    - reference(idx[first], tgt[first]).item())
        error /= reference(idx[first], tgt[first]).item()
    losses = []
    for step in range(10):
        at = (step * world + rank) * MICRO
        loss = engine(idx[at:at + MICRO], tgt[at:at + MICRO])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    again = engine.optimizer.quantize_nontrainable_params()
    # whole weights loaded into int8-stored ones are re-quantized (the reference's weights)
    from deepspeed.zero.stage3 import load_full_state_dict

    load_full_state_dict(engine.module, reference.state_dict())
    with torch.no_grad():
        reloaded = abs(engine(idx[first], tgt[first]).item()
                       - reference(idx[first], tgt[first]).item())
        reloaded /= reference(idx[first], tgt[first]).item()
    engine.destroy()
    return frozen, quantized, ratio, max(error, reloaded), losses, again


def test_frozen_weights_are_stored_int8_and_the_rest_trains(dist_pool):
    for extra in ({}, {"zero_hpz_partition_size": 2, "zero_quantized_weights": True}):
        for frozen, quantized, ratio, error, losses, again in dist_pool.run(
                _mixz_worker, world_size=2, args=(extra,)):
            assert frozen > 0 and quantized == frozen  # every frozen weight (none persistent)
            assert ratio < 0.27  # int8 + one fp32 scale per block, vs fp32
            assert error < 0.01  # forward relative error against the unquantized model
            assert losses[-1] < 0.8 * losses[0]  # the trainable part still learns
            assert again == 0  # already quantized


def _lora_after_initialize():
    import deepspeed

    model = make_gpt()
    trainable = [p for n, p in model.named_parameters() if n.startswith("head") or "ln" in n]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable,
                                           config=config(MIXZ))
    before = _frozen_facts(engine)[1]
    for param in model.parameters():  # "LoRA applied after initialize": the base freezes
        if not any(param is t for t in trainable):
            param.requires_grad_(False)
    count = engine.optimizer.quantize_nontrainable_params()
    frozen, quantized, ratio = _frozen_facts(engine)
    engine.destroy()
    return before, count, frozen, quantized, ratio


def test_quantize_nontrainable_params_after_initialize(dist_pool):
    for before, count, frozen, quantized, ratio in dist_pool.run(_lora_after_initialize,
                                                                 world_size=2):
        assert before == 0 and count == frozen == quantized > 0
        assert ratio < 0.27
