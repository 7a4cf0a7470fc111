"""async_io (DeepNVMe aio_handle): byte-exact file round trips on the native op and the fallback."""
import os

import pytest
import torch

from deepspeed.ops.aio import fallback
from deepspeed.ops.op_builder.async_io import AsyncIOBuilder

MiB = 1 << 20


@pytest.fixture(scope="module")
def native():
    builder = AsyncIOBuilder()
    assert builder.is_compatible(), builder.incompatible_reason  # always buildable on Linux
    return builder.load(verbose=False)


@pytest.fixture(params=["native", "fallback"])
def op(request):
    return request.getfixturevalue("native") if request.param == "native" else fallback


def _random_bytes(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def test_defaults_and_backend(op):
    h = op.aio_handle()
    assert (h.get_block_size(), h.get_queue_depth(), h.get_single_submit(), h.get_overlap_events(),
            h.get_intra_op_parallelism()) == (1048576, 128, False, False, 1)
    assert op.backend() in {"libaio", "pthread-pread", "python-threads"}
    with pytest.raises(ValueError, match="intra_op_parallelism"):
        op.aio_handle(intra_op_parallelism=0)


@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("nbytes,block", [(16 * MiB, 1048576), (1_000_003, 4096), (5000, 4096), (0, 4096)])
def test_sync_round_trip(op, tmp_path, threads, nbytes, block):
    h = op.aio_handle(block_size=block, queue_depth=8, intra_op_parallelism=threads)
    src, path = _random_bytes(nbytes, seed=threads), str(tmp_path / "t.bin")
    assert h.sync_pwrite(src, path) == 1
    assert os.path.getsize(path) == nbytes
    with open(path, "rb") as f:
        assert f.read() == src.numpy().tobytes()
    dst = torch.zeros_like(src)
    assert h.sync_pread(dst, path) == 1
    assert torch.equal(dst, src)


@pytest.mark.parametrize("overlap,single", [(True, False), (False, True)])
def test_async_queue_then_one_wait(op, tmp_path, overlap, single):
    h = op.aio_handle(block_size=4096, queue_depth=4, single_submit=single, overlap_events=overlap,
                      intra_op_parallelism=2)
    a, b = torch.randn(300_001), torch.randn(77, 13, dtype=torch.float64)
    assert h.async_pwrite(a, str(tmp_path / "a")) == 0
    assert h.async_pwrite(b, str(tmp_path / "b")) == 0
    assert h.wait() == 2
    ra, rb = torch.empty_like(a), torch.empty_like(b)
    assert h.async_pread(ra, str(tmp_path / "a")) == 0
    assert h.pread(rb, str(tmp_path / "b"), True, True) == 0  # validate + async_op
    assert h.wait() == 2
    assert torch.equal(ra, a) and torch.equal(rb, b)
    assert h.wait() == 0


def test_file_offset_and_validate(op, tmp_path):
    h = op.aio_handle(block_size=4096, intra_op_parallelism=2)
    path = str(tmp_path / "o.bin")
    head, tail = _random_bytes(10_000, 1), _random_bytes(20_000, 2)
    assert h.write(head, path, True) == 1
    assert h.pwrite(tail, path, True, False, 12_345) == 1
    raw = open(path, "rb").read()
    assert len(raw) == 12_345 + 20_000
    assert raw[:10_000] == head.numpy().tobytes() and raw[12_345:] == tail.numpy().tobytes()
    back = torch.empty_like(tail)
    assert h.read(back, path, True, 12_345) == 1 and torch.equal(back, tail)


def test_non_contiguous_buffer(op, tmp_path):
    h = op.aio_handle(block_size=4096)
    src = torch.randn(64, 48).t()
    path = str(tmp_path / "nc.bin")
    h.sync_pwrite(src, path)
    dst = torch.empty(64, 48).t()
    h.sync_pread(dst, path)
    assert torch.equal(dst, src)


def test_read_errors_name_file_and_sizes(op, tmp_path):
    h = op.aio_handle(block_size=4096)
    missing = str(tmp_path / "missing.bin")
    with pytest.raises(ValueError, match=r"missing\.bin"):
        h.sync_pread(torch.empty(10), missing)
    short = str(tmp_path / "short.bin")
    h.sync_pwrite(torch.zeros(100, dtype=torch.uint8), short)
    with pytest.raises(ValueError, match=r"short\.bin' holds 100 bytes, but reading 400 bytes"):
        h.sync_pread(torch.empty(100), short)
    with pytest.raises(ValueError, match="needs 150"):
        h.sync_pread(torch.empty(100, dtype=torch.uint8), short, 50)
    h.async_pwrite(torch.zeros(8), str(tmp_path / "no_dir" / "x.bin"))
    with pytest.raises(RuntimeError, match=r"no_dir/x\.bin"):
        h.wait()


def test_locked_tensor(op, tmp_path):
    h = op.aio_handle(block_size=4096)
    t = h.new_cpu_locked_tensor(3 * MiB + 7, torch.empty(0, dtype=torch.bfloat16))
    assert t.shape == (3 * MiB + 7,) and t.dtype == torch.bfloat16 and t.device.type == "cpu"
    assert h.is_pinned(t) and not h.is_pinned(torch.empty(4))
    t.copy_(torch.randn(t.numel()))
    path = str(tmp_path / "l.bin")
    h.sync_pwrite(t, path)
    back = h.new_cpu_locked_tensor(t.numel(), t)
    h.sync_pread(back, path)
    assert torch.equal(back, t)
    assert h.free_cpu_locked_tensor(t) is True and h.free_cpu_locked_tensor(back) is True
    assert h.free_cpu_locked_tensor(torch.empty(4)) is False


def test_package_entry_points_agree(native):
    import deepspeed.ops.aio as aio

    assert aio.backend() == native.backend()
    assert aio.aio_handle(intra_op_parallelism=3).get_intra_op_parallelism() == 3


def test_one_gib_native_round_trip(native, tmp_path):
    """The acceptance size, on the native path with page-aligned (O_DIRECT-eligible) buffers."""
    size = 1 << 30
    stat = os.statvfs(tmp_path)
    if stat.f_bavail * stat.f_frsize < 3 * size:
        size = 256 * MiB
    h = native.aio_handle(block_size=MiB, queue_depth=32, overlap_events=True, intra_op_parallelism=4)
    src = h.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
    period = 1_048_573  # prime: every block sees the random pattern at a different phase
    rows = size // period
    src[:rows * period].view(rows, period).copy_(_random_bytes(period, 7))
    src[rows * period:] = _random_bytes(size - rows * period, 8)
    path = str(tmp_path / "big.bin")
    assert h.async_pwrite(src, path) == 0 and h.wait() == 1
    assert os.path.getsize(path) == size
    dst = torch.zeros(size, dtype=torch.uint8)  # not aligned: exercises the buffered path
    assert h.sync_pread(dst, path) == 1
    assert torch.equal(dst, src)
