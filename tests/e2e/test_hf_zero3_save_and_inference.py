"""Getting weights out of, and running inference on, an HF model trained under ZeRO-3 through
the Trainer (issue 9; checklist hf-integration §1.9, §1.11, §1.13): `save_model` with and
without stage3_gather_16bit_weights_on_model_save, a bf16 checkpoint's weights, `evaluate()` and
`generate(synced_gpus=True)` on two ranks, and HfDeepSpeedConfig's lifetime.

One 2-rank launch of scripts/hf_zero3_save_and_inference.py (module fixture) is shared by the
assertions; every reference is computed here, in a plain single process, from the saved weights."""
import gc
import json
import os
import sys

import pytest
import torch

from test_cli import HERE, free_port, run, script

transformers = pytest.importorskip("transformers", reason="transformers is a dev extra")
pytest.importorskip("accelerate", reason="accelerate is a dev extra")

from safetensors.torch import load_file  # noqa: E402 (a transformers dependency)

sys.path.insert(0, str(HERE / "scripts"))
from hf_tiny_data import RandomTokens  # noqa: E402

pytestmark = pytest.mark.timeout(400)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_zero3_save")
    run([script("deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()),
         str(HERE / "scripts" / "hf_zero3_save_and_inference.py"), str(root)], timeout=280)
    return root


def full_shapes(root):
    config = transformers.GPT2Config.from_json_file(root / "model_config.json")
    model = transformers.GPT2LMHeadModel(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def weights_file(folder):
    found = [folder / n for n in WEIGHT_FILES if (folder / n).exists()]
    assert len(found) == 1, f"expected exactly one of {WEIGHT_FILES} in {folder}: {found}"
    path = found[0]
    return load_file(path) if path.suffix == ".safetensors" else torch.load(path,
                                                                            weights_only=True)


def reference_model(out):
    model = transformers.GPT2LMHeadModel.from_pretrained(out / "gather" / "saved")
    return model.eval()


def rank_results(out):
    return [json.loads((out / "gather" / f"result_rank{r}.json").read_text()) for r in range(2)]


def test_save_model_with_gather_writes_full_weights_that_reload(out):
    saved = weights_file(out / "gather" / "saved")
    shapes = full_shapes(out)
    assert {name: tuple(t.shape) for name, t in saved.items()} == {
        name: shape for name, shape in shapes.items() if name in saved}
    assert all(t.dtype == torch.float32 for t in saved.values())
    # the same values as the fp32 masters of the final ZeRO checkpoint, gathered offline
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    masters = get_fp32_state_dict_from_zero_checkpoint(str(out / "gather" / "checkpoint-3"))
    for name, value in saved.items():
        torch.testing.assert_close(value, masters[name], rtol=0, atol=0, msg=name)
    # and from_pretrained gives the model the wrapped (gathered) engine computed with
    with torch.no_grad():
        logits = reference_model(out)(input_ids=RandomTokens(n=64).x[:4]).logits
    trained = torch.load(out / "gather" / "logits.pt", weights_only=True)
    torch.testing.assert_close(logits, trained, rtol=1e-6, atol=1e-6)


def test_save_model_without_gather_writes_a_zero_checkpoint_and_no_weights_file(out):
    # Transformers 5 catches accelerate's ValueError, drops its dummy weights file and calls
    # engine.save_checkpoint(dir) instead: the weights are then recovered with zero_to_fp32.py
    saved = out / "nogather" / "saved"
    assert not any((saved / n).exists() for n in WEIGHT_FILES)
    assert (saved / "latest").read_text().strip() == "global_step1"
    assert (saved / "zero_to_fp32.py").exists()
    assert sorted(n for n in os.listdir(saved / "global_step1") if n.endswith("_optim_states.pt")) \
        == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(2)]


def test_no_weights_file_anywhere_holds_a_placeholder_tensor(out):
    shapes = full_shapes(out)
    files = [p for n in WEIGHT_FILES for p in out.rglob(n)]
    assert len(files) >= 4  # gather/saved, gather's two checkpoints, bf16's checkpoint
    for path in files:
        for name, value in weights_file(path.parent).items():
            assert value.numel() > 0 and tuple(value.shape) == shapes[name], (path, name)


def test_bf16_checkpoint_weights_are_bf16_roundings_of_the_fp32_masters(out):
    checkpoint = out / "bf16" / "checkpoint-2"
    saved = weights_file(checkpoint)
    shapes = full_shapes(out)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    masters = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
    for name, value in saved.items():
        assert value.dtype == torch.bfloat16 and tuple(value.shape) == shapes[name], name
        assert masters[name].dtype == torch.float32
        torch.testing.assert_close(value, masters[name].to(torch.bfloat16), rtol=0, atol=0,
                                   msg=name)


def test_zero3_evaluate_matches_a_single_process_evaluation(out):
    eval_inputs = RandomTokens(n=64).x[-8:] ^ 5  # the script's eval set, split over the ranks
    model = reference_model(out)
    # Transformers 5's evaluation passes num_items_in_batch = the label count of the batch (32
    # for 2x16, not the 30 shifted targets), so its eval_loss is each batch's summed token loss
    # over 32, averaged over the (equal-sized) batches; computed the same way here
    with torch.no_grad():
        per_batch = [model(input_ids=batch, labels=batch,
                           num_items_in_batch=torch.tensor(batch.numel())).loss
                     for batch in eval_inputs.split(2)]
    expected = torch.stack(per_batch).mean().item()
    results = rank_results(out)
    # each rank evaluated its own half of the set
    halves = [sorted(map(tuple, r["eval_inputs"])) for r in results]
    assert all(len(h) == 4 for h in halves)
    assert sorted(halves[0] + halves[1]) == sorted(map(tuple, eval_inputs.tolist()))
    for result in results:
        assert result["metrics"]["eval_loss"] == pytest.approx(expected, rel=1e-5)


def test_zero3_generate_with_synced_gpus_matches_single_process_greedy(out):
    model = reference_model(out)
    results = rank_results(out)
    # the ranks really did differ: one finished generating steps before the other
    assert results[0]["prompt"] != results[1]["prompt"]
    assert results[0]["max_new_tokens"] != results[1]["max_new_tokens"]
    for result in results:
        prompt = torch.tensor([result["prompt"]])
        with torch.no_grad():
            expected = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                      max_new_tokens=result["max_new_tokens"], do_sample=False)
        assert result["generated"] == expected[0].tolist()
        assert len(result["generated"]) > len(result["prompt"])


def test_hf_deepspeed_config_enables_zero3_only_while_alive():
    from transformers.integrations import HfDeepSpeedConfig, is_deepspeed_zero3_enabled

    gc.collect()
    assert not is_deepspeed_zero3_enabled()
    hf_ds_config = HfDeepSpeedConfig({"train_micro_batch_size_per_gpu": 1,
                                      "zero_optimization": {"stage": 3}})
    assert is_deepspeed_zero3_enabled() and hf_ds_config.is_zero3()
    del hf_ds_config
    gc.collect()
    assert not is_deepspeed_zero3_enabled()
    stage2 = HfDeepSpeedConfig({"zero_optimization": {"stage": 2}})
    assert not is_deepspeed_zero3_enabled() and not stage2.is_zero3()
