"""ZeRO++ block quantization: round trip within scale/2 per block (int8 and int4), the packed
byte form, block fitting, and the Triton kernels equal to the torch path (interpreter on CPU;
natively on a GPU, with a bandwidth figure)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deepspeed.zero.zeropp import quantize as Q

HERE = Path(__file__).parent


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("numel, block", [(1, 8), (100, 16), (5000, 256), (4096, 2048)])
def test_round_trip_is_within_half_a_scale_per_block(bits, numel, block):
    torch.manual_seed(numel)
    x = torch.randn(numel) * torch.logspace(-3, 1, numel)  # blocks of very different scales
    q, scales = Q.quantize(x, block, bits)
    assert q.dtype == torch.int8 and q.shape == (Q.blocks_of(numel, block), block)
    assert int(q.abs().max()) <= Q.qmax(bits)
    back = Q.dequantize(q, scales, numel)
    padded = torch.zeros(q.numel())
    padded[:numel] = (back - x).abs()
    per_block = padded.view(-1, block).amax(dim=1)
    assert torch.all(per_block <= scales / 2 * (1 + 1e-6)), (per_block / scales).max()


@pytest.mark.parametrize("bits", [8, 4])
def test_packed_form_decodes_to_the_same_values_alone_and_in_rows(bits):
    x = torch.randn(3, 1000)
    rows = [Q.quantize_packed(r, 256, bits) for r in x]
    assert all(r.numel() == Q.packed_nbytes(1000, 256, bits) for r in rows)
    alone = [Q.dequantize_packed(r, 1000, 256, bits) for r in rows]
    together = Q.dequantize_rows(torch.cat(rows), 3, 1000, 256, bits)
    for i in range(3):
        assert torch.equal(alone[i], together[i])
        assert (alone[i] - x[i]).abs().max() < x[i].abs().max() / Q.qmax(bits)


def test_blocks_fit_the_shard_instead_of_padding_it():
    assert Q.fit_block(100, 2048) == 104  # one block, not 2048 mostly empty elements
    assert Q.fit_block(5000, 2048) == 1672  # three blocks of <= 2048
    assert Q.fit_block(4096, 2048) == 2048
    # int8 of a 100-element shard: 104 bytes + one scale, a quarter of fp32's 400
    assert Q.packed_nbytes(100, 2048, 8) == 108


def test_bad_bit_width_is_refused():
    with pytest.raises(ValueError, match="4 or 8 bits"):
        Q.quantize(torch.ones(4), 4, bits=3)


def _run_checks(device, interpret):
    env = dict(os.environ, TRITON_INTERPRET="1" if interpret else "0")
    proc = subprocess.run([sys.executable, str(HERE / "zeropp_triton_checks.py"), device],
                          env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == 4, proc.stdout
    return proc.stdout


def _has_triton():
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


needs_triton = pytest.mark.skipif(not _has_triton(), reason="triton is not installed")


@needs_triton
def test_triton_kernels_equal_the_torch_path_under_the_interpreter():
    _run_checks("cpu", interpret=True)


@needs_triton
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the Triton kernels need a GPU")
def test_triton_kernels_equal_the_torch_path_on_gpu():
    print(_run_checks("cuda", interpret=False))


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_an_overflowed_block_decodes_to_nan_so_the_loss_scaler_sees_it(bad):
    x = torch.ones(16)
    x[3] = bad
    back = Q.dequantize_packed(Q.quantize_packed(x, 8, 4), 16, 8, 4)
    assert torch.isnan(back[:8]).all() and torch.equal(back[8:], torch.ones(8))
