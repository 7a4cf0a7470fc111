"""MoQ's quantizer on its own: schedule with an offset, ternary/binary at the end, the
fp16/quantized blend, state round trip; and its checkpoint through the engine (also one written
in the layout before plugin_states)."""
import pytest
import torch

from deepspeed.compression.config import QuantizeTrainingConfig
from deepspeed.compression.moq import MoQQuantizer


def _moq(**overrides):
    body = {"enabled": True, "quantize_groups": 2,
            "quantize_bits": {"start_bits": 3, "target_bits": 1},
            "quantize_schedule": {"quantize_period": 1, "schedule_offset": 3}}
    body.update(overrides)
    return MoQQuantizer(QuantizeTrainingConfig.model_validate(body))


def test_offset_then_ternary_then_binary():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4, bias=True)
    bias = model.bias.detach().clone()
    moq = _moq()
    original = model.weight.detach().clone()
    history = []
    for step in range(1, 8):
        moq.step(model, step)
        levels = max(r.unique().numel() for r in model.weight.detach().reshape(2, -1))
        history.append((moq.bits, levels))
    assert torch.equal(model.bias, bias)  # 1-D tensors are left alone
    # untouched before the offset (step 3); counted from it, the doubling period (1, 2, 4)
    # puts the drops at steps 4 and 5
    assert history[0] == (3, original.reshape(2, -1)[0].unique().numel())
    bits = [b for b, _ in history]
    assert bits == [3, 3, 3, 2, 1, 1, 1]
    for b, levels in history[2:]:
        assert levels <= {3: 8, 2: 3, 1: 2}[b]
    assert history[-1][1] == 2


def test_fp16_mixed_quantize_blends_toward_quantized():
    torch.manual_seed(0)
    weight = torch.randn(4, 8)
    model = torch.nn.Linear(8, 4, bias=False)
    moq = _moq(quantize_bits={"start_bits": 4, "target_bits": 4},
               quantize_schedule={"quantize_period": 100, "schedule_offset": 0},
               fp16_mixed_quantize={"enabled": True, "quantize_change_ratio": 0.25})
    from deepspeed.compression.quantizers import quantize_tensor

    for step, ratio in ((1, 0.75), (2, 0.5)):
        with torch.no_grad():
            model.weight.copy_(weight)
        moq.step(model, step)
        expected = ratio * weight + (1 - ratio) * quantize_tensor(weight, 4, 2)
        torch.testing.assert_close(model.weight.detach(), expected)
    state = moq.state_dict()
    again = _moq()
    again.load_state_dict(state)
    assert again.state_dict() == state


def _save_and_resume(save_dir, layout):
    import deepspeed
    from deepspeed import comm as dist
    from deepspeed.testing.checkpoints import write_pre_stateful_layout

    def engine_for():
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        config = {"train_micro_batch_size_per_gpu": 2,
                  "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
                  "quantize_training": {"enabled": True, "quantize_bits": {"start_bits": 8,
                                                                           "target_bits": 4},
                                        "quantize_schedule": {"quantize_period": 1,
                                                              "schedule_offset": 0}}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
        return engine

    engine = engine_for()
    for _ in range(3):
        engine.backward(engine(torch.randn(2, 8)).sum())
        engine.step()
    saved = (engine.quantize_bits(), engine.quantizer.period)
    engine.save_checkpoint(save_dir, tag="t")
    engine.destroy()
    moved = None
    if layout == "pre-stateful" and dist.get_rank() == 0:  # the file as plugins wrote it before
        moved = write_pre_stateful_layout(f"{save_dir}/t")
    dist.barrier()
    resumed = engine_for()
    fresh = (resumed.quantize_bits(), resumed.quantizer.period)
    resumed.load_checkpoint(save_dir, tag="t")
    loaded = (resumed.quantize_bits(), resumed.quantizer.period)
    resumed.destroy()
    return saved, fresh, loaded, moved


@pytest.mark.parametrize("layout", ["plugin_states", "pre-stateful"])
def test_moq_state_survives_a_checkpoint(dist_pool, tmp_path, layout):
    results = dist_pool.run(_save_and_resume, args=(str(tmp_path), layout))
    for saved, fresh, loaded, _ in results:
        assert saved == (6, 4) and fresh == (8, 1) and loaded == saved
    # the old layout kept the state at the top-level key "ds_compression"
    assert results[0][3] == (["ds_compression"] if layout == "pre-stateful" else None)
