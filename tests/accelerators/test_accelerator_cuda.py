"""The CUDA accelerator imports and answers without a GPU; its device checks need one."""
import pytest
import torch

from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator


@pytest.fixture
def cuda():
    return CUDA_Accelerator()


def test_static_answers_without_gpu(cuda):
    assert cuda._name == "cuda"
    assert cuda.communication_backend_name() == "nccl"
    assert cuda.device_name() == "cuda"
    assert cuda.device_name(1) == "cuda:1"
    assert cuda.is_available() == torch.cuda.is_available()
    assert cuda.visible_devices_envs() == ["CUDA_VISIBLE_DEVICES"]
    assert cuda.export_envs() == ["NCCL"]
    assert cuda.is_synchronized_device() is False
    assert cuda.on_accelerator(torch.ones(1)) is False


def test_legacy_tensor_types_match_by_dtype_and_device(cuda):
    assert not isinstance(torch.zeros(1), cuda.FloatTensor)
    assert not isinstance(torch.zeros(1, device="meta"), cuda.FloatTensor)
    assert repr(cuda.HalfTensor) == "LegacyTensorType(torch.float16, 'cuda')"


def test_legacy_tensor_type_constructor_semantics():
    from deepspeed.accelerator.tensor_types import LegacyTensorType

    floats = LegacyTensorType(torch.float32, "cpu")
    assert floats(2, 3).shape == (2, 3)
    assert floats(torch.Size([4])).shape == (4,)
    assert torch.equal(floats([1, 2]), torch.tensor([1.0, 2.0]))
    assert floats().numel() == 0
    assert isinstance(floats(1), floats)
    with pytest.raises(TypeError, match="sizes"):
        floats([1], [2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_device_and_memory(cuda):
    assert cuda.device_count() == torch.cuda.device_count() >= 1
    cuda.set_device(0)
    assert cuda.current_device() == 0
    assert cuda.current_device_name() == "cuda:0"
    before = cuda.memory_allocated()
    x = torch.ones(1 << 20, device=cuda.current_device_name())
    assert cuda.memory_allocated() - before >= 4 << 20
    assert cuda.max_memory_allocated() >= cuda.memory_allocated()
    assert cuda.on_accelerator(x)
    assert 0 < cuda.available_memory() <= cuda.total_memory()
    assert isinstance(cuda.FloatTensor(3), cuda.FloatTensor)
    assert cuda.FloatTensor([1.0, 2.0]).device.type == "cuda"
    with cuda.device(0):
        assert torch.cuda.current_device() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_streams_events_rng_pinning(cuda):
    stream = cuda.Stream()
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    with cuda.stream(stream):
        start.record()
        y = torch.ones(256, 256, device="cuda") @ torch.ones(256, 256, device="cuda")
        end.record()
    cuda.synchronize()
    assert start.elapsed_time(end) >= 0.0
    assert y[0, 0].item() == 256.0
    cuda.manual_seed(7)
    state = cuda.get_rng_state()
    first = torch.rand(3, device="cuda")
    cuda.set_rng_state(state)
    assert torch.equal(torch.rand(3, device="cuda"), first)
    assert isinstance(cuda.default_generator(0), torch.Generator)
    pinned = cuda.pin_memory(torch.ones(4))
    assert cuda.is_pinned(pinned)
    assert cuda.is_fp16_supported()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_graph_capture(cuda):
    static_in = torch.ones(8, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        static_out = static_in * 2  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = cuda.create_graph()
    with cuda.capture_to_graph(graph):
        static_out = static_in * 2
    static_in.fill_(3.0)
    cuda.replay_graph(graph)
    cuda.synchronize()
    assert torch.equal(static_out, torch.full((8,), 6.0, device="cuda"))
