"""The DS4Sci_EvoformerAttention tutorial's MSA row-wise call, runnable: Q/K/V
``[Batch, N_seq, N_res, Head, Dim]``, a residue mask ``[Batch, N_seq, 1, 1, N_res]`` (as an additive
bias) and a pair bias ``[Batch, 1, Head, N_res, N_res]``, in bf16 as the docs require; forward and
backward, checked against the naive form computed in fp32 from the same inputs.

    python examples/deepspeed4science/evoformer_attention.py [--n-seq 16 --n-res 256]

On CPU the chunked torch path runs, on a GPU the Triton kernels. Exits non-zero on a mismatch.
"""
import argparse
import sys

import torch

from deepspeed.ops.deepspeed4science import DS4Sci_EvoformerAttention, evoformer_attention_reference


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--n-seq", type=int, default=16)
    parser.add_argument("--n-res", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=32)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    b, n, r, h, d = args.batch, args.n_seq, args.n_res, args.heads, args.dim
    torch.manual_seed(0)
    dtype = torch.bfloat16
    Q, K, V = (torch.randn(b, n, r, h, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    res_mask = (torch.rand(b, n, 1, 1, r, device=device) > 0.1).to(dtype)
    res_mask = 1e9 * (res_mask - 1)  # 0 where attended, -1e9 where masked
    pair_bias = torch.randn(b, 1, h, r, r, device=device, dtype=dtype, requires_grad=True)

    out = DS4Sci_EvoformerAttention(Q, K, V, [res_mask, pair_bias])
    out.float().square().mean().backward()

    leaves = [t.detach().float().requires_grad_() for t in (Q, K, V, pair_bias)]
    ref = evoformer_attention_reference(*leaves[:3], [res_mask.float(), leaves[3]])
    ref.square().mean().backward()
    errors = {"out": (out.float() - ref).abs().max().item()}
    for name, got, want in zip(("dQ", "dK", "dV", "dpair_bias"), (Q, K, V, pair_bias), leaves):
        errors[name] = ((got.grad.float() - want.grad).abs().max() / want.grad.abs().max()).item()
    print(f"{device} bf16 out {tuple(out.shape)}; max error vs fp32 naive (grads relative to their max): "
          + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    if max(errors.values()) > 3e-2:
        sys.exit("DS4Sci_EvoformerAttention differs from the naive reference")


if __name__ == "__main__":
    main()
