"""Weight-only int8 inference: the weights take a quarter of their fp32 bytes (counted), every
quantized layer stays within its documented error bound, and the logits of tiny models stay
within the documented bound of fp32 (max |logits_int8 - logits_fp32| <= 2% of max |logits_fp32|,
argmax tokens mostly unchanged); on 2 ranks int8 composes with AutoTP."""
import pytest
import torch

import deepspeed
from deepspeed.inference.quantize import dequantize, int8_parts, output_error_bound, quantize

from inference_models import build, input_ids

LOGITS_BOUND = 0.02  # relative to max |fp32 logits|; docs/guides/inference.md documents the same figure


def _int8_bytes(module):
    codes = scales = 0
    for m in module.modules():
        parts = int8_parts(m)
        if parts is not None:
            assert parts[0].dtype is torch.int8
            codes += parts[0].numel() * parts[0].element_size()
            scales += parts[1].numel() * parts[1].element_size()
    return codes, scales


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("q_groups", [1, 4])
def test_quantize_round_trip_within_half_a_step(symmetric, q_groups):
    torch.manual_seed(0)
    w = torch.randn(16, 64)
    codes, scale, zero = quantize(w, q_groups, symmetric)
    assert codes.dtype is torch.int8 and scale.shape == (16, q_groups)
    err = (dequantize(codes, scale, zero) - w).abs().reshape(16, q_groups, -1)
    assert (err <= scale.unsqueeze(-1) / 2 + 1e-6).all()


def test_linear_output_within_documented_bound():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 24)
    x = torch.randn(5, 64)
    want = lin(x)
    # the bound is the weights' rounding: inputs exact (activation quantization off)
    engine = deepspeed.init_inference(lin, dtype=torch.int8,
                                      quant={"weight": {"q_groups": 2},
                                             "activation": {"enabled": False}})
    got = engine(x)
    scale = int8_parts(lin)[1]
    assert ((got - want).abs() <= output_error_bound(x, scale) + 1e-5).all()
    assert not torch.equal(got, want)  # it really is quantized


@pytest.mark.parametrize("name", ["llama", "opt", "t5"])
def test_logits_within_bound_and_weights_four_times_smaller(name):
    model, decoder = build(name)
    ids = input_ids()
    kwargs = {"decoder_input_ids": input_ids(length=5, seed=2)} if name == "t5" else {}
    fp32_linear_bytes = sum(m.weight.numel() * 4 for m in model.modules()
                            if isinstance(m, torch.nn.Linear)
                            and m.weight is not getattr(model.get_input_embeddings(), "weight", None))
    with torch.no_grad():
        reference = model(ids, **kwargs).logits
    engine = deepspeed.init_inference(model, dtype=torch.int8)
    with torch.no_grad():
        logits = engine(ids, **kwargs).logits
    codes, scales = _int8_bytes(engine.module)
    assert codes * 4 == fp32_linear_bytes  # every untied Linear weight: 1 byte instead of 4
    assert scales <= codes / 8  # one fp32 scale per row of >= 32 weights
    assert sum(b for b, _ in engine.quantized.values()) == fp32_linear_bytes
    err = (logits - reference).abs().max().item()
    assert 0 < err <= LOGITS_BOUND * reference.abs().max().item(), err
    agree = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree


def test_bad_quant_settings_name_the_key():
    with pytest.raises(ValueError, match="q_groups=3 does not divide"):
        deepspeed.init_inference(torch.nn.Linear(8, 4), dtype=torch.int8,
                                 quant={"weight": {"q_groups": 3}})
    with pytest.raises(ValueError, match="num_bits=4"):
        deepspeed.init_inference(torch.nn.Linear(8, 4), dtype=torch.int8,
                                 quant={"weight": {"num_bits": 4}})


def _int8_with_tp():
    model, _ = build("llama")
    ids = input_ids()
    with torch.no_grad():
        reference = model(ids).logits
    engine = deepspeed.init_inference(model, dtype=torch.int8, tensor_parallel={"tp_size": 2})
    with torch.no_grad():
        logits = engine(ids).logits
    return (logits - reference).abs().max().item() / reference.abs().max().item(), len(engine.quantized)


def test_int8_with_tensor_parallel(dist_pool):
    for rel, count in dist_pool.run(_int8_with_tp, world_size=2):
        assert rel <= LOGITS_BOUND and count == 2 * 7 + 1  # 7 Linears a block, the LM head
