"""``enable_cuda_graph=True``: refused on a machine without CUDA; the greedy decoding loop it
captures (run eagerly here, the same step code) gives Hugging Face ``generate``'s tokens, EOS
handling included; generate options a captured loop cannot do are refused by name; on a GPU the
replayed graphs give eager's tokens and logits."""
import pytest
import torch

import deepspeed
from deepspeed.inference.cuda_graph import (CudaGraphError, GreedyDecoder, _clone_outputs,
                                            _greedy_settings)

from inference_models import build, input_ids

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_refused_without_cuda():
    model, _ = build("llama")
    with pytest.raises(CudaGraphError, match="needs a CUDA device"):
        deepspeed.init_inference(model, dtype=torch.float, enable_cuda_graph=True)


def _hf_tokens(model, ids, **kwargs):
    """generate()'s greedy tokens; the prompts are unpadded, which an all-ones attention_mask
    says (without it generate would take the prompt's pad_token_id tokens for padding)."""
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              **kwargs)


def _decoded(model, ids, new, min_new=0, pad=0, eos=()):
    decoder = GreedyDecoder(model, ids.shape[0], 32, eos, capture=False)
    return decoder.generate(ids, new, min_new, pad)


def test_static_cache_greedy_loop_gives_generates_tokens():
    model, _ = build("llama")
    model.generation_config.eos_token_id = None
    for batch in (1, 3):
        ids = input_ids(batch=batch)
        want = _hf_tokens(model, ids, max_new_tokens=9, pad_token_id=0)
        new, min_new, pad, eos = _greedy_settings(
            model, ids, dict(max_new_tokens=9, pad_token_id=0, attention_mask=torch.ones_like(ids)))
        assert (new, min_new, pad, eos) == (9, 0, 0, ())
        assert torch.equal(_decoded(model, ids, new, min_new, pad, eos), want)


def test_eos_finishes_rows_pads_them_and_stops_like_generate():
    model, _ = build("llama")
    model.generation_config.eos_token_id = None
    ids = input_ids(batch=2)
    free = _hf_tokens(model, ids, max_new_tokens=8, pad_token_id=0)
    eos = int(free[0, ids.shape[1] + 2])  # row 0's third new token becomes EOS
    for kwargs in (dict(max_new_tokens=8, eos_token_id=eos, pad_token_id=5),
                   dict(max_new_tokens=8, eos_token_id=eos, pad_token_id=5, min_new_tokens=6),
                   dict(max_new_tokens=8, eos_token_id=[eos, 7])):
        want = _hf_tokens(model, ids, **kwargs)
        new, min_new, pad, eos_ids = _greedy_settings(
            model, ids, dict(kwargs, attention_mask=torch.ones_like(ids)))
        got = _decoded(model, ids, new, min_new, pad, eos_ids)
        assert torch.equal(got, want), (kwargs, got, want)


@pytest.mark.parametrize("kwargs, named", [
    (dict(do_sample=True), "do_sample=True"), (dict(num_beams=2), "num_beams=2"),
    (dict(repetition_penalty=1.3), "repetition_penalty"), (dict(streamer=object()), "streamer"),
    (dict(use_cache=False), "use_cache=False"),
    (dict(attention_mask=torch.tensor([[0, 1, 1]])), "padded prompts"),
    (dict(pad_token_id=0), "treats as padding")])
def test_what_the_captured_loop_cannot_do_is_refused_by_name(kwargs, named):
    model, _ = build("llama")
    with pytest.raises(CudaGraphError, match=named):
        _greedy_settings(model, torch.zeros(1, 3, dtype=torch.long),
                         dict(max_new_tokens=4, **kwargs))


def test_forward_outputs_a_replay_cannot_refresh_are_refused():
    from transformers import DynamicCache

    out = {"logits": torch.ones(2), "past_key_values": DynamicCache()}
    with pytest.raises(CudaGraphError, match="use_cache=False"):
        _clone_outputs(out)
    copied = _clone_outputs((torch.ones(2), [None, 3]))
    assert torch.equal(copied[0], torch.ones(2)) and copied[1] == [None, 3]



@pytest.mark.gpu
@needs_gpu
def test_gpu_graph_generate_and_forward_equal_eager():
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cuda":
        pytest.skip("the active accelerator is not CUDA")
    model, _ = build("llama")
    model = model.cuda()
    model.generation_config.eos_token_id = None
    ids = input_ids(batch=3).cuda()
    ones = torch.ones_like(ids)
    want = _hf_tokens(model, ids, max_new_tokens=12, pad_token_id=0)
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
    engine = deepspeed.init_inference(model, dtype=torch.float, enable_cuda_graph=True)
    for _ in range(2):  # the second call replays the graph the first captured
        got = engine.generate(ids, attention_mask=ones, max_new_tokens=12, pad_token_id=0)
        assert torch.equal(got, want), (got, want)
    assert len(engine.cuda_graphs.decoders) == 1
    decoder = next(iter(engine.cuda_graphs.decoders.values()))
    assert decoder.graph is not None
    for _ in range(2):
        with torch.no_grad():
            got = engine(ids, use_cache=False).logits
        torch.testing.assert_close(got, logits, rtol=1e-5, atol=1e-5)
    assert len(engine.cuda_graphs.forward_graphs) == 1
    with pytest.raises(CudaGraphError, match="use_cache=False"):
        engine(ids[:, :5])  # a causal LM's default forward returns its KV cache
