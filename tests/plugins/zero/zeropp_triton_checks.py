"""Run by test_zeropp_quantize in a fresh process (TRITON_INTERPRET must be set before triton
is imported): the Triton int8 kernels against the torch path on ``sys.argv[1]``'s device.
Prints one "ok" line per case; on CUDA also the kernels' effective bandwidth."""
import sys

import torch

from deepspeed.zero.zeropp import quantize as Q
from deepspeed.zero.zeropp import triton_quant as T


def check(device, numel, block):
    torch.manual_seed(numel)
    x = torch.randn(numel, device=device) * 3
    q, scales = T.quantize(x, block)
    ref_q, ref_scales = Q.quantize(x.cpu(), block)  # the torch path, on the host
    assert torch.equal(q.cpu(), ref_q), (q.cpu() - ref_q).abs().max()
    assert torch.allclose(scales.cpu(), ref_scales, rtol=1e-6, atol=0)
    back = T.dequantize(q, scales, numel, torch.float32)
    assert torch.allclose(back.cpu(), Q.dequantize(ref_q, ref_scales, numel), rtol=1e-6, atol=1e-7)
    x[0] = float("nan")  # an overflowed block decodes to nan, as on the torch path
    q, scales = T.quantize(x, block)
    back = T.dequantize(q, scales, numel, torch.float32).cpu()
    assert torch.isnan(back[:min(block, numel)]).all() and not torch.isnan(back[block:]).any()
    print(f"ok {device} numel={numel} block={block}")


def bandwidth(numel=1 << 26, block=2048):
    x = torch.randn(numel, device="cuda")
    for _ in range(3):
        q, s = T.quantize(x, block)
        T.dequantize(q, s, numel)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for name, fn, moved in (("quantize", lambda: T.quantize(x, block), numel * 5),
                            ("dequantize", lambda: T.dequantize(q, s, numel), numel * 5)):
        start.record()
        for _ in range(20):
            fn()
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / 20
        print(f"bandwidth {name}: {moved / seconds / 1e9:.0f} GB/s ({numel} fp32 elements, "
              f"block {block})")


if __name__ == "__main__":
    device = sys.argv[1]
    for numel, block in ((1, 8), (1000, 104), (5000, 1672), (1 << 16, 2048)):
        check(device, numel, block)
    if device == "cuda":
        bandwidth()
