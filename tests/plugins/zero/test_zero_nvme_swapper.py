"""OptimizerStateSwapper: bit-exact round trips through the native aio op and its Python fallback."""
import os

import pytest
import torch

from deepspeed.ops import aio
from deepspeed.ops.aio import fallback
from deepspeed.zero.offload.nvme import OptimizerStateSwapper, validate_nvme_path
from tiny_models import mlp


def _native_handle():
    if aio.load_op() is fallback:
        pytest.skip("the async_io extension did not build here; only the fallback is available")
    return aio.aio_handle(block_size=65536, queue_depth=8, intra_op_parallelism=2)


ENGINES = {
    "native": _native_handle,
    "fallback": lambda: fallback.aio_handle(block_size=65536, intra_op_parallelism=2),
}


@pytest.fixture(params=sorted(ENGINES))
def make_swapper(request, tmp_path):
    made = []

    def make(optimizer, rank=0, **kwargs):
        kwargs.setdefault("handle", ENGINES[request.param]())
        sw = OptimizerStateSwapper(optimizer, str(tmp_path), rank, **kwargs)
        made.append(sw)
        return sw

    make.engine = request.param
    yield make
    for sw in made:
        sw.close()


def _bits(t):
    """Raw bytes, so NaN payloads and -0.0 count as differences too."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).clone()


def _snapshot(param, state):
    tensors = {k: (v.shape, v.dtype, _bits(v)) for k, v in state.items() if torch.is_tensor(v)}
    return param.data.shape, param.data.dtype, _bits(param.data), tensors


def test_engines_are_the_expected_ones(make_swapper):
    sw = make_swapper(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    if make_swapper.engine == "fallback":
        assert type(sw.handle) is fallback.aio_handle
    else:
        assert aio.backend() in ("libaio", "pthread-pread")
        assert type(sw.handle) is not fallback.aio_handle


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_is_bit_exact_and_frees_memory(make_swapper, dtype):
    gen = torch.Generator().manual_seed(0)
    sizes = [1_000_003, 1, 0]
    params = [torch.nn.Parameter(torch.randn(n, generator=gen).to(dtype)) for n in sizes]
    opt = torch.optim.Adam(params)
    for p, n in zip(params, sizes):
        p.grad = torch.ones_like(p)
        opt.state[p] = {"step": torch.tensor(7.0), "exp_avg": torch.randn(n, generator=gen).to(dtype),
                        # non-contiguous, with special values that a lossy path would mangle
                        "exp_avg_sq": torch.tensor([float("nan"), -0.0, float("inf")] * 2).to(dtype)
                        .reshape(2, 3).t(), "note": "kept in memory"}
    before = [_snapshot(p, opt.state[p]) for p in params]
    sw = make_swapper(opt)

    for p in params:
        sw.swap_out(p)
    sw.wait()
    expected_bytes = sum(p_shape.numel() * torch.tensor([], dtype=p_dtype).element_size()
                         + sum(len(b) for _, _, b in st.values())
                         for p_shape, p_dtype, _, st in before)
    assert sw.swapped_bytes() == expected_bytes
    on_disk = sum(os.path.getsize(os.path.join(sw.swap_dir, f)) for f in os.listdir(sw.swap_dir))
    assert on_disk == expected_bytes
    assert len(os.listdir(sw.swap_dir)) == 4 * len(params)  # data + 3 state tensors each
    for p, n in zip(params, sizes):
        assert sw.is_swapped(p)
        assert p.data.numel() == 0 and p.data.dtype == dtype
        assert torch.equal(p.grad, torch.ones(n, dtype=dtype))  # grad untouched
        st = opt.state[p]
        assert st["note"] == "kept in memory"
        assert all(st[k].numel() == 0 for k in ("step", "exp_avg", "exp_avg_sq"))

    sw.prefetch(params[0])  # one prefetched, the others read on demand
    for p, snap in zip(params, before):
        sw.swap_in(p)
        assert not sw.is_swapped(p)
        after = _snapshot(p, opt.state[p])
        assert after[:2] == snap[:2] and torch.equal(after[2], snap[2])
        assert after[3].keys() == snap[3].keys()
        for k, (shape, dt, bits) in snap[3].items():
            assert after[3][k][:2] == (shape, dt) and torch.equal(after[3][k][2], bits)
        assert opt.state[p]["note"] == "kept in memory"
    assert sw.swapped_bytes() == 0


def _train(make_swapper_or_none, steps=5, **swapper_kwargs):
    model = mlp(7, 13, 3, activation=torch.nn.Tanh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sw = make_swapper_or_none(opt, **swapper_kwargs) if make_swapper_or_none else None
    data = torch.randn(steps, 5, 7, generator=torch.Generator().manual_seed(1))
    params = list(model.parameters())
    for step in range(steps):
        if sw is not None:
            for p in params[: step % len(params)]:
                sw.prefetch(p)  # a varying mix of prefetched and on-demand reads
            for p in params:
                sw.swap_in(p)
        opt.zero_grad()
        model(data[step]).pow(2).sum().backward()
        opt.step()
        if sw is not None:
            for p in params:
                sw.swap_out(p)
                assert p.data.numel() == 0
    if sw is not None:
        for p in params:
            sw.swap_in(p)
    return [p.detach().clone() for p in params], opt


def _assert_same_training(make_swapper, **kwargs):
    ref, ref_opt = _train(None)
    got, opt = _train(make_swapper, **kwargs)
    for a, b in zip(ref, got):
        assert torch.equal(a, b)
    for p_ref, p in zip(ref_opt.state, opt.state):
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(ref_opt.state[p_ref][k], opt.state[p][k])


def test_adam_with_swapping_matches_adam_without(make_swapper):
    _assert_same_training(make_swapper)


def test_adam_with_one_buffer_and_pinning_matches_adam_without(tmp_path):
    """Swapper logic only, so the fast engine suffices (native libaio pays ~30 ms per request here)."""
    made = []

    def make(opt, **kwargs):
        made.append(OptimizerStateSwapper(opt, tmp_path, 0, handle=fallback.aio_handle(), **kwargs))
        return made[-1]

    _assert_same_training(make, buffer_count=1, pin_memory=True)
    assert made[0].swapped_bytes() == 0
    made[0].close()


def test_param_without_state_swaps_only_its_data(make_swapper):
    p = torch.nn.Parameter(torch.arange(10, dtype=torch.float32))
    opt = torch.optim.Adam([p])
    sw = make_swapper(opt)
    sw.swap_out(p)
    assert sw.swapped_bytes() == 40
    assert p not in opt.state  # no empty state entry conjured up
    sw.swap_in(p)
    assert torch.equal(p.data, torch.arange(10, dtype=torch.float32))
    sw.swap_in(p)  # no-op when not swapped
    sw.prefetch(p)
    assert torch.equal(p.data, torch.arange(10, dtype=torch.float32))


def test_rewrite_of_same_param_and_identity_is_kept(make_swapper):
    p = torch.nn.Parameter(torch.ones(3000))
    opt = torch.optim.SGD([p], lr=1.0)
    sw = make_swapper(opt)
    for value in (1.0, 2.0, 3.0):
        p.data.fill_(value)
        sw.swap_out(p)
        sw.swap_in(p)  # back-to-back: the read must wait for the write of the same file
        assert opt.param_groups[0]["params"][0] is p
        assert torch.equal(p.data, torch.full((3000,), value))


def test_ranks_and_swappers_sharing_a_path_do_not_collide(make_swapper, tmp_path):
    ps = [torch.nn.Parameter(torch.full((100,), float(i))) for i in range(4)]
    opts = [torch.optim.SGD([p], lr=0.1) for p in ps]
    swappers = [make_swapper(opts[0], rank=0), make_swapper(opts[1], rank=0),
                make_swapper(opts[2], rank=1), make_swapper(opts[3], rank=1)]
    for sw, p in zip(swappers, ps):
        sw.swap_out(p)
        sw.wait()
    rank0 = tmp_path / "zero_stage_optimizer" / "rank0"
    assert len(os.listdir(rank0)) == 2 and len(os.listdir(tmp_path / "zero_stage_optimizer" / "rank1")) == 2
    swappers[0].swap_in(ps[0])
    swappers[0].close()
    assert len(os.listdir(rank0)) == 1  # the other swapper's file survives the first close
    for i, (sw, p) in enumerate(zip(swappers[1:], ps[1:]), start=1):
        sw.swap_in(p)
        assert torch.equal(p.data, torch.full((100,), float(i)))
        sw.close()
    assert not (tmp_path / "zero_stage_optimizer").exists()


def test_close_removes_the_folder_and_later_use_fails(make_swapper, tmp_path):
    p = torch.nn.Parameter(torch.randn(50))
    sw = make_swapper(torch.optim.SGD([p], lr=0.1), rank=3, folder="my_swap")
    sw.swap_out(p)
    assert (tmp_path / "my_swap" / "rank3").is_dir()
    sw.close()
    assert not (tmp_path / "my_swap").exists()
    with pytest.raises(RuntimeError, match="closed"):
        sw.swap_in(p)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to stage through the host")
@pytest.mark.parametrize("pin", [False, True])
def test_device_tensors_are_staged_through_host(make_swapper, pin):
    p = torch.nn.Parameter(torch.randn(1001, device="cuda", dtype=torch.bfloat16))
    opt = torch.optim.Adam([p])
    opt.state[p] = {"exp_avg": torch.randn(1001, device="cuda")}
    want_p, want_s = p.data.clone(), opt.state[p]["exp_avg"].clone()
    sw = make_swapper(opt, pin_memory=pin)
    sw.swap_out(p)
    assert p.data.numel() == 0 and p.data.device.type == "cuda"
    sw.swap_in(p)
    torch.cuda.synchronize()
    assert p.data.device.type == "cuda" and torch.equal(p.data, want_p)
    assert torch.equal(opt.state[p]["exp_avg"], want_s)


# ---- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [None, "", "   "])
def test_validate_rejects_empty(bad):
    with pytest.raises(ValueError, match="offload_optimizer.nvme_path"):
        validate_nvme_path(bad)


def test_validate_rejects_missing_dir_and_file(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match="does not exist") as err:
        validate_nvme_path(missing, key="zero_optimization.offload_param.nvme_path")
    assert "offload_param.nvme_path" in str(err.value) and str(missing) in str(err.value)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="not a directory") as err:
        validate_nvme_path(f)
    assert str(f) in str(err.value)
    assert validate_nvme_path(tmp_path) == str(tmp_path)
    assert os.listdir(tmp_path) == ["file"]  # the probe file is gone


def _can_write(directory):
    try:
        (directory / "probe").write_text("x")
    except PermissionError:
        return False
    (directory / "probe").unlink()
    return True


def test_validate_rejects_read_only_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    try:
        if _can_write(ro):
            pytest.skip("this user (root?) can write into a 0o500 directory")
        with pytest.raises(ValueError, match="not writable") as err:
            validate_nvme_path(ro)
        assert str(ro) in str(err.value)
        with pytest.raises(ValueError, match="not writable"):
            OptimizerStateSwapper(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), ro, 0)
    finally:
        os.chmod(ro, 0o700)


@pytest.mark.parametrize("kwargs,match", [
    ({"rank": -1}, "rank"), ({"rank": 0, "buffer_count": 0}, "buffer_count"),
    ({"rank": 0, "folder": "a/b"}, "folder"),
    ({"rank": 0, "aio_kwargs": {"block_size": 4096}, "handle": object()}, "not both"),
])
def test_bad_arguments(tmp_path, kwargs, match):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match=match):
        OptimizerStateSwapper(opt, tmp_path, **kwargs)


def test_aio_kwargs_build_the_default_engine(tmp_path):
    p = torch.nn.Parameter(torch.randn(5000))
    want = p.data.clone()
    sw = OptimizerStateSwapper(torch.optim.SGD([p], lr=0.1), tmp_path, 0,
                               aio_kwargs={"block_size": 8192, "queue_depth": 4})
    assert sw.handle.get_block_size() == 8192
    sw.swap_out(p)
    sw.swap_in(p)
    sw.close()
    assert torch.equal(p.data, want)


def test_validate_reports_a_refused_probe_file(tmp_path, monkeypatch):
    """The refusal path even where the read-only test is skipped (root writes anywhere)."""
    from deepspeed.zero.offload import nvme

    def refuse(**kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(nvme.tempfile, "mkstemp", refuse)
    with pytest.raises(ValueError, match="not writable \\(Permission denied\\)") as err:
        validate_nvme_path(tmp_path, key="my.key")
    assert "my.key" in str(err.value) and str(tmp_path) in str(err.value)
