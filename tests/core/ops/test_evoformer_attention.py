"""DS4Sci_EvoformerAttention: the chunked torch path and the Triton kernels equal the naive
reference for the documented variants (forward and backward); the chunked path's measured peak
memory stays far below the naive one's; bad shapes and dtypes are refused by name."""
import pytest
import torch

from deepspeed.ops.deepspeed4science import DS4Sci_EvoformerAttention, evoformer_attention_reference
from deepspeed.ops.deepspeed4science.chunked import CHUNK_ENV, chunk_plan
from deepspeed.testing.memory import peak_bytes
from evoformer_cases import compare, variant
from triton_check_runner import needs_cuda, needs_triton, run_checks



@pytest.mark.parametrize("name", ["row", "column", "triangle"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("budget", ["64", "100000000"])  # many small chunks / one chunk
def test_chunked_path_equals_naive_reference(name, dtype, budget, monkeypatch):
    monkeypatch.setenv(CHUNK_ENV, budget)
    compare(name, dtype, backend="torch")


def test_mask_bias_gradient_is_summed_over_heads_and_queries(monkeypatch):
    monkeypatch.setenv(CHUNK_ENV, "64")
    (q, k, v), biases = variant("row")
    biases = [torch.randn_like(biases[0]).requires_grad_(), biases[1].requires_grad_()]
    out = DS4Sci_EvoformerAttention(q, k, v, biases, backend="torch")
    ref = evoformer_attention_reference(q, k, v, biases)
    got = torch.autograd.grad(out.sum(), biases)
    want = torch.autograd.grad(ref.sum(), biases)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_no_bias_one_bias_and_longer_keys():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 2, 8, generator=gen)
    k, v = (torch.randn(2, 3, 9, 2, 8, generator=gen) for _ in range(2))
    for biases in ([], [None, None], [torch.randn(2, 1, 2, 5, 9, generator=gen)]):
        torch.testing.assert_close(DS4Sci_EvoformerAttention(q, k, v, biases),
                                   evoformer_attention_reference(q, k, v, biases), rtol=1e-5, atol=1e-5)


def test_chunk_plan_bounds_the_score_block():
    assert chunk_plan(1, 64, 8, 1024, 1024, budget=1 << 20) == (1, 128)
    assert chunk_plan(1, 64, 8, 16, 16, budget=1 << 20) == (64, 16)
    assert chunk_plan(1, 4, 8, 4096, 4096, budget=16) == (1, 1)


def test_peak_memory_at_a_long_sequence_is_below_the_naive_path(monkeypatch):
    """MSA row-wise, N_res 384: the naive path holds [B, N, H, L, L] scores and probabilities."""
    monkeypatch.setenv(CHUNK_ENV, str(1 << 18))
    gen = torch.Generator().manual_seed(0)
    b, n, l, h, d = 1, 8, 384, 4, 16
    q, k, v = (torch.randn(b, n, l, h, d, generator=gen, requires_grad=True) for _ in range(3))
    biases = [torch.zeros(b, n, 1, 1, l), torch.randn(b, 1, h, l, l, generator=gen, requires_grad=True)]

    def step(fn):
        return lambda: fn(q, k, v, biases).sum().backward()

    chunked, _ = peak_bytes(step(DS4Sci_EvoformerAttention))
    naive, _ = peak_bytes(step(evoformer_attention_reference))
    score_bytes = b * n * h * l * l * 4
    assert naive >= 2 * score_bytes  # scores and probabilities both live in the naive path
    # what remains is O(inputs + pair-bias gradient + one chunk), not O(N * pair bias)
    assert chunked < score_bytes and 4 * chunked < naive, (chunked, naive)


@pytest.mark.parametrize("args,match", [
    (dict(q=(1, 2, 4, 2)), "Q must be a 5-D tensor"),
    (dict(dtype=torch.float64), "Q has dtype torch.float64; allowed: float16, bfloat16"),
    (dict(k=(1, 2, 4, 2, 16)), "K and V must be"),
    (dict(bias=(1, 2, 2, 4, 3)), r"bias 0 must be 5-D and broadcastable to \[batch, rows, heads, Lq, Lk\]"),
    (dict(bias=(1, 2, 1, 4)), "bias 0 must be 5-D"),
    (dict(nbias=3), "at most 2 tensors"),
])
def test_bad_inputs_are_refused(args, match):
    q = torch.randn(*args.get("q", (1, 2, 4, 2, 8)), dtype=args.get("dtype", torch.float32))
    k = torch.randn(*args.get("k", (1, 2, 4, 2, 8)), dtype=q.dtype)
    biases = [torch.zeros(args.get("bias", (1, 2, 1, 1, 4)))] * args.get("nbias", 1)
    with pytest.raises(ValueError, match=match):
        DS4Sci_EvoformerAttention(q, k, k, biases)


def test_forcing_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 2, 4, 2, 8)
    with pytest.raises(RuntimeError, match="needs a CUDA tensor|triton is not installed"):
        DS4Sci_EvoformerAttention(q, q, q, [], backend="triton")


def test_forcing_triton_under_a_broken_interpreter_says_why(monkeypatch):
    from deepspeed.ops import triton_support

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(triton_support, "triton_status", lambda: (True, "3.6.0"))
    monkeypatch.setattr(triton_support, "interpreter_problem", lambda: "numpy refuses int() of arrays")
    q = torch.randn(1, 2, 4, 2, 8)
    with pytest.raises(RuntimeError, match="'triton' on a cpu tensor: numpy refuses int"):
        DS4Sci_EvoformerAttention(q, q, q, [], backend="triton")


@needs_triton
def test_triton_kernels_under_the_interpreter():
    run_checks("evoformer_triton_checks", "cpu", interpret=True)


@needs_triton
@needs_cuda
@pytest.mark.gpu
def test_triton_kernels_on_gpu():
    run_checks("evoformer_triton_checks", "cuda", interpret=False)
