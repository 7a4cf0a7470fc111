"""The FusedAdam / FusedLamb CUDA kernels' own code, run on the CPU: a harness
(fixtures/fused_kernels_host.cu, built with nvcc) plans the launches as the GPU path does and runs
every block's code one emulated thread at a time. Checked without a GPU: every element is
updated exactly once for any mix of sizes, block counts and table overflows; the 16-byte vector
path, the peeled path for views that start off a 16-byte boundary and the element path compute
bit-identical results; and the updates match the PyTorch path (Adam: the double-precision
formula and torch's fused AdamW; LAMB: ``lamb_update_``), in fp32, bf16, fp16 and with fp32
moments for 16-bit params."""
import ctypes
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from deepspeed.ops.lamb.functional import lamb_update_
from deepspeed.ops.op_builder import CSRC_ROOT

NVCC = (os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc") if os.environ.get("CUDA_HOME")
        else shutil.which("nvcc"))
pytestmark = pytest.mark.skipif(NVCC is None or not os.path.exists(NVCC),
                                reason="nvcc is not on PATH (and CUDA_HOME is unset)")

HARNESS = Path(__file__).parent / "fixtures" / "fused_kernels_host.cu"
CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
P = ctypes.c_void_p


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("fused_host") / "fused_kernels_host.so"
    # PTX only for sm_90 (no ptxas pass: the device code is not what runs here), but the same
    # __CUDA_ARCH_LIST__ as a real sm_90 build, so the tables have the GPU build's capacity
    cmd = [NVCC, "-shared", "-Xcompiler", "-fPIC", "-std=c++17", "-O1",
           "-gencode", "arch=compute_90,code=compute_90", f"-I{CSRC_ROOT / 'adam'}",
           f"-I{CSRC_ROOT / 'lamb'}", str(HARNESS), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stderr[-4000:]}"
    lib = ctypes.CDLL(str(out))
    for name in ("ds_host_count", "ds_host_adam", "ds_host_lamb"):
        getattr(lib, name).restype = ctypes.c_char_p
    lib.ds_host_lamb_scratch.restype = ctypes.c_int64
    return lib


def _ptrs(tensors):
    return (P * len(tensors))(*[t.data_ptr() for t in tensors])


def _sizes(tensors):
    return (ctypes.c_int64 * len(tensors))(*[t.numel() for t in tensors])


def _check(err):
    assert err is None, err.decode()


def _views(sizes, dtype, shift, gen):
    """Random tensors of ``sizes``, each a view ``shift`` elements into its own buffer (so a
    shift that is not a multiple of 16 bytes starts it off a 16-byte boundary)."""
    out = []
    for n in sizes:
        base = torch.full((n + shift + 8,), float("nan"), dtype=dtype)
        base[shift:shift + n] = torch.randn(n, generator=gen).to(dtype)
        out.append(base[shift:shift + n])
    return out


# sizes: empty, single elements, vector-width edges, several blocks' worth, one big tensor
SIZES = [0, 1, 7, 8, 9, 33, 1000, 4097, 0, 3, 20000, 16, 65, 129]


@pytest.mark.parametrize("resident,min_share,threads", [
    (1, 1, 1), (7, 8, 3), (13, 1, 32), (64, 100, 5), (3, 5000, 2)])
def test_every_element_is_visited_once(lib, resident, min_share, threads):
    counts = [torch.zeros(n, dtype=torch.int32) for n in SIZES]
    misaligned = ctypes.c_int64(0)
    _check(lib.ds_host_count(ctypes.c_int64(min_share), ctypes.c_int64(resident), threads,
                             len(counts), _ptrs(counts), _sizes(counts), ctypes.byref(misaligned)))
    for n, c in zip(SIZES, counts):
        assert torch.equal(c, torch.ones(n, dtype=torch.int32)), (n, c.tolist()[:40])
    assert misaligned.value == 0  # segment edges inside a tensor are kSegmentAlign multiples


def test_more_tensors_than_one_table_holds(lib):
    capacity = lib.ds_host_table_capacity(1)
    assert capacity > 600, capacity  # 32 KiB kernel arguments for an sm_90 build (CUDA 12.1+)
    sizes = [1 + i % 11 for i in range(2 * capacity + 5)]
    counts = [torch.zeros(n, dtype=torch.int32) for n in sizes]
    misaligned = ctypes.c_int64(0)
    _check(lib.ds_host_count(ctypes.c_int64(4), ctypes.c_int64(9), 2, len(counts),
                             _ptrs(counts), _sizes(counts), ctypes.byref(misaligned)))
    assert all(torch.equal(c, torch.ones_like(c)) for c in counts)
    assert lib.ds_host_table_capacity(4) > 600 and lib.ds_host_table_capacity(5) > 500


HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)


def _adam_host(lib, params, grads, ms, vs, step, adamw, bias_correction=True, threads=3,
               resident=11, min_share=16, hyper=HYPER):
    _check(lib.ds_host_adam(
        CODES[params[0].dtype], CODES[ms[0].dtype], ctypes.c_int64(min_share),
        ctypes.c_int64(resident), threads, len(params), _ptrs(params), _ptrs(grads), _ptrs(ms),
        _ptrs(vs), _sizes(params), ctypes.c_double(hyper["lr"]), ctypes.c_double(hyper["beta1"]),
        ctypes.c_double(hyper["beta2"]), ctypes.c_double(hyper["eps"]), ctypes.c_int64(step),
        int(adamw), int(bias_correction), ctypes.c_double(hyper["weight_decay"])))


def _adam_run(lib, dtype, state_dtype, shifts, adamw=True, steps=3, **kw):
    """Params after ``steps`` harness steps, params/grads/moments shifted by ``shifts``."""
    gen = torch.Generator().manual_seed(0)
    sizes = [n for n in SIZES if n]
    params = _views(sizes, dtype, shifts[0], gen)
    ms = [t.zero_() for t in _views(sizes, state_dtype, shifts[2], gen)]
    vs = [t.zero_() for t in _views(sizes, state_dtype, shifts[2], gen)]
    grad_gen = torch.Generator().manual_seed(1)
    for step in range(1, steps + 1):
        grads = _views(sizes, dtype, shifts[1], grad_gen)
        _adam_host(lib, params, grads, ms, vs, step, adamw, **kw)
    return [p.clone() for p in params]


def _double_adam(dtype, steps=3, adamw=True):
    gen = torch.Generator().manual_seed(0)
    sizes = [n for n in SIZES if n]
    params = [p.double() for p in _views(sizes, dtype, 0, gen)]
    grad_gen = torch.Generator().manual_seed(1)
    ms = [torch.zeros_like(p) for p in params]
    vs = [torch.zeros_like(p) for p in params]
    lr, b1, b2, eps, wd = (HYPER[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay"))
    for t in range(1, steps + 1):
        grads = [g.double() for g in _views(sizes, dtype, 0, grad_gen)]
        for i, g in enumerate(grads):
            g = g if adamw else g + wd * params[i]
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            p = params[i] * (1 - lr * wd) if adamw else params[i]
            params[i] = p - lr / (1 - b1 ** t) * ms[i] / (vs[i].sqrt() / math.sqrt(1 - b2 ** t)
                                                          + eps)
    return params


@pytest.mark.parametrize("dtype,state_dtype", [
    (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.float32), (torch.float16, torch.float16),
    (torch.float16, torch.float32)])
def test_adam_vector_peeled_and_element_paths_agree_bitwise(lib, dtype, state_dtype):
    aligned = _adam_run(lib, dtype, state_dtype, (0, 0, 0))
    # every list shifted alike: peeled to 16-byte runs; params shifted alone: element path
    # wherever no one peel aligns them all
    for shifts in [(3, 3, 3 if state_dtype == dtype else None), (1, 0, 0), (0, 5, 2)]:
        if shifts[2] is None:  # fp32 moments: shift them by the same bytes as the 16-bit lists
            shifts = (shifts[0], shifts[1], shifts[0] * dtype.itemsize // 4 or 0)
        other = _adam_run(lib, dtype, state_dtype, shifts)
        for a, b in zip(aligned, other):
            assert torch.equal(a, b), shifts
    single = _adam_run(lib, dtype, state_dtype, (0, 0, 0), threads=1, resident=1)
    assert all(torch.equal(a, b) for a, b in zip(aligned, single))


@pytest.mark.parametrize("adamw", [True, False])
@pytest.mark.parametrize("dtype,state_dtype,tol", [
    (torch.float32, torch.float32, dict(rtol=1e-5, atol=1e-6)),
    (torch.bfloat16, torch.float32, dict(rtol=1.6e-2, atol=1e-2)),
    (torch.bfloat16, torch.bfloat16, dict(rtol=1.6e-2, atol=1e-2)),
    (torch.float16, torch.float16, dict(rtol=2e-3, atol=2e-3))])
def test_adam_matches_the_double_formula(lib, adamw, dtype, state_dtype, tol):
    got = _adam_run(lib, dtype, state_dtype, (0, 0, 0), adamw=adamw)
    want = _double_adam(dtype, adamw=adamw)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, **tol)


def test_adam_fp32_matches_torch_fused_adamw(lib):
    """The kernel and torch's fused AdamW (the PyTorch path's kernel) agree to fp32 rounding."""
    got = _adam_run(lib, torch.float32, torch.float32, (0, 0, 0))
    gen = torch.Generator().manual_seed(0)
    sizes = [n for n in SIZES if n]
    params = [p.clone() for p in _views(sizes, torch.float32, 0, gen)]
    ms = [torch.zeros_like(p) for p in params]
    vs = [torch.zeros_like(p) for p in params]
    grad_gen = torch.Generator().manual_seed(1)
    for step in range(1, 4):
        grads = [g.contiguous() for g in _views(sizes, torch.float32, 0, grad_gen)]
        torch._fused_adamw_(params, grads, ms, vs, [], [torch.tensor(float(step))] * len(params),
                            lr=HYPER["lr"], beta1=HYPER["beta1"], beta2=HYPER["beta2"],
                            weight_decay=HYPER["weight_decay"], eps=HYPER["eps"], amsgrad=False,
                            maximize=False)
    for a, b in zip(got, params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # an update is ~1e-2


# tools/bench/fused_adam_bench.py's: an update of ~1e-3 against params of ~1
BENCH_HYPER = dict(HYPER, lr=1e-3, weight_decay=0.01)


def _torch_cuda_adamw(params, grads, ms, vs, step, hyper):
    """torch's CUDA fused AdamW, emulated with its expression types: fp32 storage, the
    hyper-parameters in double (so ``beta * m + (1 - beta) * g`` and the decay are double
    arithmetic rounded once into fp32), the bias corrections rounded to fp32, and the final
    ``step_size * m / denom`` in fp32."""
    lr, b1, b2, eps, wd = (hyper[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay"))
    f32 = torch.float32
    bias1 = torch.tensor(1 - b1 ** step, dtype=f32).double()
    bias2_sqrt = torch.tensor(math.sqrt(1 - b2 ** step), dtype=f32)
    step_size = torch.tensor(lr / bias1.item(), dtype=f32)
    for p, g, m, v in zip(params, grads, ms, vs):
        pd, gd = p.double(), g.double()
        p.copy_((pd - lr * wd * pd).to(f32))
        m.copy_((b1 * m.double() + (1 - b1) * gd).to(f32))
        v.copy_((b2 * v.double() + (1 - b2) * gd * gd).to(f32))
        denom = ((v.sqrt() / bias2_sqrt).double() + eps).to(f32)
        p.sub_(step_size * m / denom)


def test_adam_fp32_is_within_two_ulps_of_torch_cuda_fused_adamw(lib):
    """Stricter than the tolerance above: no more than 0.1% of fp32 params may end a step more
    than 2 ulps from torch's, the H200 benchmark's criterion (with its hyper-parameters; at
    lr 1e-2 fp32 rounding of the update alone moves params below ~1e-2 by more). It failed at 2%
    while the kernel
    computed 1 - beta in fp32 registers (1 - float(0.999) is off by 1.3e-5 relative)."""
    gen = torch.Generator().manual_seed(3)
    params = [torch.randn(n, generator=gen) for n in (65536, 4097, 1000)]
    grads = [torch.randn(p.numel(), generator=gen) for p in params]
    ours = [p.clone() for p in params]
    ms, vs = [torch.zeros_like(p) for p in ours], [torch.zeros_like(p) for p in ours]
    ref_ms, ref_vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    for step in (1, 2):
        _adam_host(lib, ours, grads, ms, vs, step, adamw=True, hyper=BENCH_HYPER)
        _torch_cuda_adamw(params, grads, ref_ms, ref_vs, step, BENCH_HYPER)
    eps = torch.finfo(torch.float32).eps
    off = sum(int(((a.double() - b.double()).abs()
                   > 2 * eps * b.double().abs().clamp(min=1e-3)).sum())
              for a, b in zip(ours, params))
    assert off / sum(p.numel() for p in params) <= 1e-3


LAMB = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01, max_coeff=0.5,
            min_coeff=0.01)


@pytest.mark.parametrize("eps_inside_sqrt", [False, True])
@pytest.mark.parametrize("dtype,state_dtype,shift", [
    (torch.float32, torch.float32, 0), (torch.float32, torch.float32, 1),
    (torch.bfloat16, torch.bfloat16, 3), (torch.bfloat16, torch.float32, 0)])
def test_lamb_matches_the_pytorch_path(lib, eps_inside_sqrt, dtype, state_dtype, shift):
    gen = torch.Generator().manual_seed(0)
    sizes = [n for n in SIZES if n]
    params = _views(sizes, dtype, shift, gen)
    ref_params = [p.float().clone() for p in params]
    ms = [t.zero_() for t in _views(sizes, state_dtype, 0, gen)]
    vs = [t.zero_() for t in _views(sizes, state_dtype, 0, gen)]
    ref_ms = [torch.zeros_like(p) for p in ref_params]
    ref_vs = [torch.zeros_like(p) for p in ref_params]
    grad_gen = torch.Generator().manual_seed(1)
    n = len(params)
    for step in range(1, 4):
        grads = _views(sizes, dtype, shift, grad_gen)
        scratch = torch.full((lib.ds_host_lamb_scratch(n, _sizes(params)),), float("nan"))
        norms = torch.zeros(2 * n)
        coeffs = torch.ones(n)
        _check(lib.ds_host_lamb(
            CODES[dtype], CODES[state_dtype], ctypes.c_int64(16), ctypes.c_int64(7), n,
            _ptrs(params), _ptrs(grads), _ptrs(ms), _ptrs(vs), _sizes(params),
            P(scratch.data_ptr()), P(norms.data_ptr()), P(coeffs.data_ptr()),
            ctypes.c_double(LAMB["lr"]), ctypes.c_double(LAMB["beta1"]),
            ctypes.c_double(LAMB["beta2"]), ctypes.c_double(LAMB["eps"]), int(eps_inside_sqrt),
            ctypes.c_int64(step), 1, ctypes.c_double(LAMB["weight_decay"]),
            ctypes.c_double(LAMB["max_coeff"]), ctypes.c_double(LAMB["min_coeff"]),
            ctypes.c_double(2.0)))
        ref_coeffs = lamb_update_(ref_params, [g.float() for g in grads], ref_ms, ref_vs,
                                  step=step, eps_inside_sqrt=eps_inside_sqrt,
                                  bias_correction=True, grad_scale=2.0, **LAMB)
        if dtype == torch.float32:
            torch.testing.assert_close(coeffs, ref_coeffs, rtol=1e-5, atol=1e-6)
        else:  # the PyTorch path's reference runs in fp32 throughout: compare one step only
            torch.testing.assert_close(coeffs, ref_coeffs, rtol=2e-3, atol=1e-4)
            ref_params = [p.float().clone() for p in params]
            ref_ms = [m.float().clone() for m in ms]
            ref_vs = [v.float().clone() for v in vs]
    if dtype == torch.float32:
        for a, b in zip(params, ref_params):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert float(coeffs.max()) <= LAMB["max_coeff"]
