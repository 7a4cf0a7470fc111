"""transient_empty: big host buffers live in a mapping of their own, gone when the tensor dies."""
import gc

import pytest
import torch

from deepspeed.utils.transient_buffers import MIN_UNHEAPED_BYTES, transient_empty


def _mappings_of(nbytes):
    """Address ranges of exactly ``nbytes`` in this process's memory map."""
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if end - start == nbytes:
                found.add(start)
    return found


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8])
def test_a_big_buffer_is_an_ordinary_writable_tensor(dtype):
    numel = 3 * MIN_UNHEAPED_BYTES // dtype.itemsize + 5
    buffer = transient_empty(numel, dtype, "cpu")
    assert buffer.shape == (numel,) and buffer.dtype == dtype and buffer.is_contiguous()
    buffer.fill_(3)
    torch.cat([torch.ones(numel - 5, dtype=dtype), torch.zeros(5, dtype=dtype)], out=buffer)
    assert buffer[:numel - 5].eq(1).all() and buffer[numel - 5:].eq(0).all()
    view = buffer.view(-1, 1)[:4]
    view.add_(1)
    assert buffer[:4].eq(2).all()


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/maps"), reason="needs Linux")
def test_the_mapping_goes_when_the_tensor_dies():
    nbytes = 37 * (1 << 20)  # an unusual size: its own mapping is recognisable
    before = _mappings_of(nbytes)
    buffer = transient_empty(nbytes // 4, torch.float32, "cpu")
    a_view = buffer[10:20]
    mine = _mappings_of(nbytes) - before
    assert len(mine) == 1, "a big buffer must get an anonymous mapping of its own"
    assert buffer.data_ptr() == next(iter(mine))
    del buffer
    gc.collect()
    assert _mappings_of(nbytes) - before == mine, "a live view keeps the mapping"
    del a_view
    gc.collect()
    assert not (_mappings_of(nbytes) - before), "the mapping outlived its last tensor"


def test_small_buffers_come_from_torch_empty():
    small = transient_empty(MIN_UNHEAPED_BYTES // 4 - 1, torch.float32, "cpu")
    assert small.numel() == MIN_UNHEAPED_BYTES // 4 - 1
    empty = transient_empty(0, torch.float32, torch.device("cpu"))
    assert empty.numel() == 0
