"""``replace_with_kernel_inject=True``: on CPU it falls back to AutoTP + SDPA with one log line
and the outputs equal the plain model; the bias-GeLU fusion (used on GPU) computes the same
as the unfused MLP; the Triton kernel equals eager PyTorch under the interpreter; on a GPU the
injected engine (and int8) equal eager within tolerance."""
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import deepspeed
from deepspeed.inference.kernel_inject import FusedBiasGeLU, fuse_bias_gelu

from inference_models import build, input_ids, split_matches

HERE = Path(__file__).parent


def _has_triton():
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


# the CPU fallback is what a machine without a GPU takes; with one, the accelerator is CUDA and
# the kernels are injected (test_gpu_injected_and_int8_equal_eager), and two ranks cannot share
# one GPU over NCCL
cpu_only = pytest.mark.skipif(torch.cuda.is_available(),
                              reason="checks the CPU fallback; this machine's accelerator is CUDA")


@cpu_only
def test_cpu_falls_back_with_one_log_line(caplog):
    model, _ = build("llama")
    ids = input_ids()
    with torch.no_grad():
        reference = model(ids).logits
    logger = logging.getLogger("DeepSpeed")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="DeepSpeed"):
            engine = deepspeed.init_inference(model, dtype=torch.float,
                                              replace_with_kernel_inject=True)
    finally:
        logger.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if "replace_with_kernel_inject" in r.getMessage()]
    assert len(lines) == 1 and "falls back to AutoTP" in lines[0], lines
    assert engine.injected == {"sdpa": True, "fused": []}
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        assert (engine(ids).logits - reference).abs().max().item() <= 1e-5


def _kernel_inject_tp2():
    model, _ = build("gpt_neox")
    _, diff, same = split_matches(model, input_ids(), new_tokens=4, kernel_inject=True)
    return diff, same


@cpu_only
def test_cpu_fallback_with_tp2(dist_pool):
    for diff, same in dist_pool.run(_kernel_inject_tp2, world_size=2):
        assert diff <= 1e-5 and same


@pytest.mark.parametrize("name, fused", [
    ("gpt_neox", ["gpt_neox.layers.0.mlp.dense_h_to_4h", "gpt_neox.layers.1.mlp.dense_h_to_4h"]),
    ("bert", ["bert.encoder.layer.0.intermediate.dense", "bert.encoder.layer.1.intermediate.dense"]),
])
def test_bias_gelu_fusion_computes_the_same(name, fused):
    model, _ = build(name)
    ids = input_ids()
    with torch.no_grad():
        reference = model(ids).logits
    assert fuse_bias_gelu(model) == fused
    assert all(isinstance(model.get_submodule(n), FusedBiasGeLU) for n in fused)
    with torch.no_grad():
        assert (model(ids).logits - reference).abs().max().item() <= 1e-5


@pytest.mark.skipif(not _has_triton(), reason="triton is not installed")
def test_triton_bias_gelu_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(HERE / "bias_gelu_checks.py"), "cpu"], env=env,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == 4, proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_injected_and_int8_equal_eager():
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cuda":
        pytest.skip("the active accelerator is not CUDA")
    proc = subprocess.run([sys.executable, str(HERE / "bias_gelu_checks.py"), "cuda"],
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("gpt_neox", "bert", "llama"):
        model, _ = build(name)
        model = model.cuda().half()
        ids = input_ids().cuda()
        with torch.no_grad():
            reference = model(ids).logits.float()
        engine = deepspeed.init_inference(model, dtype=torch.half, kernel_inject=True)
        if name != "llama":
            assert engine.injected["fused"], name
        with torch.no_grad():
            got = engine(ids).logits.float()
        assert (got - reference).abs().max().item() <= 2e-2 * reference.abs().max().item()
    model, _ = build("llama")
    model = model.cuda()
    with torch.no_grad():
        reference = model(input_ids().cuda()).logits
    engine = deepspeed.init_inference(model, dtype=torch.int8)
    with torch.no_grad():
        got = engine(input_ids().cuda()).logits
    assert (got - reference).abs().max().item() <= 0.02 * reference.abs().max().item()
