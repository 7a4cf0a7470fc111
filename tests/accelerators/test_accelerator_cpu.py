"""The CPU accelerator: the checks the accelerator tutorial lists for a machine without CUDA."""
import os

import psutil
import pytest
import torch

from deepspeed.accelerator import get_accelerator
from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator, HostEvent, HostStream

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="auto-detection picks CUDA on a GPU machine")


@pytest.fixture
def cpu():
    return get_accelerator()


def test_auto_detected_as_cpu(cpu):
    assert isinstance(cpu, CPU_Accelerator)
    assert cpu._name == "cpu"
    assert cpu.device_name() == "cpu"
    assert cpu.device_name(3) == "cpu"
    assert cpu.current_device_name() == "cpu"
    assert cpu.is_available() is True


def test_communication_backend_is_gloo_without_oneccl(cpu):
    try:
        import oneccl_bindings_for_pytorch  # noqa: F401
    except ImportError:
        assert cpu.communication_backend_name() == "gloo"
    else:
        assert cpu.communication_backend_name() == "ccl"


def test_doc_snippet_allocates_on_current_device(cpu):
    t = torch.empty((2, 3), dtype=torch.float32, device=cpu.current_device_name())
    assert t.device.type == "cpu"
    assert cpu.on_accelerator(t)
    assert cpu.on_accelerator(torch.ones(1).to(cpu.device_name()))
    assert not cpu.on_accelerator(torch.ones(1, device="meta"))


def test_pin_memory_returns_the_tensor(cpu):
    t = torch.arange(4.0)
    assert cpu.pin_memory(t) is t
    assert cpu.is_pinned(t) is False


def test_device_context_is_noop(cpu):
    before = torch.ones(1).device
    with cpu.device(0) as dev:
        assert torch.device(dev).type == "cpu"
        assert torch.ones(1).device == before


def test_current_device_follows_set_device_and_local_rank(cpu, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert cpu.current_device() == 1
    cpu.set_device(0)
    assert cpu.current_device() == 0
    with pytest.raises(ValueError, match="non-negative"):
        cpu.set_device(-1)
    monkeypatch.setenv("LOCAL_RANK", "x")
    fresh = CPU_Accelerator()
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        fresh.current_device()


def test_device_count_is_numa_nodes(cpu, monkeypatch):
    monkeypatch.delenv("LOCAL_SIZE", raising=False)
    nodes = [n for n in os.listdir("/sys/devices/system/node") if n[4:].isdigit()] \
        if os.path.isdir("/sys/devices/system/node") else []
    assert cpu.device_count() == max(len(nodes), 1)


def test_device_count_follows_launcher_local_size(cpu, monkeypatch):
    """Inside a launched job each local rank is one device, so a 4-rank job on a one-NUMA-node
    machine passes ``world_size <= device_count()``."""
    monkeypatch.setenv("LOCAL_SIZE", "4")
    assert cpu.device_count() == 4
    for bad in ("0", "four"):
        monkeypatch.setenv("LOCAL_SIZE", bad)
        with pytest.raises(ValueError, match="LOCAL_SIZE"):
            cpu.device_count()


def test_rng_roundtrip(cpu):
    cpu.manual_seed(123)
    assert cpu.initial_seed() == 123
    state = cpu.get_rng_state()
    first = torch.rand(3)
    cpu.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)
    assert cpu.default_generator(0) is torch.default_generator
    assert cpu.random() is torch.random


def test_streams_and_events_are_host_side(cpu):
    stream = cpu.Stream()
    assert isinstance(stream, HostStream)
    with cpu.stream(stream) as s:
        assert s is stream
    assert cpu.current_stream() is cpu.default_stream()
    start, end = cpu.Event(enable_timing=True), cpu.Event(enable_timing=True)
    with pytest.raises(RuntimeError, match="recorded"):
        start.elapsed_time(end)
    start.record()
    sum(range(1000))
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0
    assert isinstance(stream.record_event(), HostEvent)
    cpu.synchronize()


def test_memory_stats_track_rss_and_peak(cpu):
    before = cpu.memory_allocated()
    assert abs(before - psutil.Process().memory_info().rss) < 64 * 2**20
    big = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched, so resident
    during = cpu.memory_allocated()
    assert during - before > 32 * 2**20
    del big
    assert cpu.max_memory_allocated() >= during
    assert cpu.max_memory_reserved() >= during
    cpu.reset_peak_memory_stats()
    stats = cpu.memory_stats()
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"] > 0
    assert stats["allocated_bytes.all.peak"] < during  # the 64 MiB went back to the OS on del
    assert 0 < cpu.available_memory() <= cpu.total_memory() == psutil.virtual_memory().total
    assert cpu.memory_cached() > 0 and cpu.max_memory_cached() >= cpu.memory_cached()


def test_dtypes(cpu):
    assert cpu.is_bf16_supported()
    a = torch.ones(2, 2, dtype=torch.float16)
    assert cpu.is_fp16_supported() == ((a @ a).dtype == torch.float16)
    assert cpu.supported_dtypes()[0] == torch.float32
    assert torch.bfloat16 in cpu.supported_dtypes()
    assert cpu.FloatTensor([1.0]).dtype == torch.float32
    assert cpu.HalfTensor(2).shape == (2,)
    assert isinstance(torch.zeros(1, dtype=torch.long), cpu.LongTensor)


def test_runtime_helpers(cpu):
    assert cpu.is_triton_supported() is False
    assert cpu.is_synchronized_device() and cpu.use_host_timers()
    assert cpu.lazy_call(lambda: 7) == 7
    assert cpu.range_push("outer") == 0
    assert cpu.range_push("inner") == 1
    assert cpu.range_pop() == 1
    assert cpu.range_pop() == 0
    assert cpu.range_pop() == -1
    graph = cpu.create_graph()
    assert graph is None
    with cpu.capture_to_graph(graph):
        x = torch.ones(1) + 1
    cpu.replay_graph(graph)
    assert x.item() == 2.0
    assert cpu.amp() is torch.cpu.amp


def test_range_shows_in_profiler(cpu):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        cpu.range_push("ds_range_probe")
        torch.ones(4).sum()
        cpu.range_pop()
    assert any(evt.name == "ds_range_probe" for evt in prof.events())


def test_visible_devices_envs(cpu):
    assert cpu.visible_devices_envs() == ["CUDA_VISIBLE_DEVICES"]
    env = {}
    cpu.set_visible_devices_envs(env, [0, 2])
    assert env == {"CUDA_VISIBLE_DEVICES": "0,2"}
    with pytest.raises(ValueError, match="non-negative ints"):
        cpu.set_visible_devices_envs(env, [0, "a"])
    assert all(isinstance(p, str) for p in cpu.export_envs())


def test_compile_backend(cpu):
    assert cpu.get_compile_backend() == "inductor"
    cpu.set_compile_backend("eager")
    assert cpu.get_compile_backend() == "eager"
    with pytest.raises(ValueError, match="no_such_backend"):
        cpu.set_compile_backend("no_such_backend")
