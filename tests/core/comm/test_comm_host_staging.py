"""Host tensors on a device-only backend (NCCL) are staged through the accelerator for
all_reduce and broadcast. CPU ranks have no NCCL, so gloo is declared device-only here and the
staging path runs with the CPU accelerator's device: the results must be the ones gloo gives
directly, synchronously and through an async work's wait. On a GPU machine one NCCL rank
stages for real."""
import pytest
import torch


def _stage_on_gloo():
    import torch

    import deepspeed.comm as dist
    from deepspeed.comm import backend_ops

    calls = []
    real = backend_ops._staged

    def counting(tensor, run, async_op):
        calls.append(async_op)
        return real(tensor, run, async_op)

    backend_ops.DEVICE_ONLY_BACKENDS.add("gloo")
    backend_ops._staged = counting
    try:
        rank = dist.get_rank()
        summed = torch.tensor([rank + 1.0, 10.0])
        dist.all_reduce(summed)
        later = torch.tensor([float(rank)])
        work = dist.all_reduce(later, async_op=True)
        work.wait()
        sent = torch.tensor([rank * 7.0 + 3.0])
        dist.broadcast(sent, src=1)
    finally:
        backend_ops.DEVICE_ONLY_BACKENDS.discard("gloo")
        backend_ops._staged = real
    return summed.tolist(), later.tolist(), sent.tolist(), calls


@pytest.mark.skipif(torch.cuda.is_available(), reason="two ranks on gloo; a GPU machine's is NCCL")
def test_host_tensors_are_staged_and_copied_back(dist_pool):
    for summed, later, sent, calls in dist_pool.run(_stage_on_gloo, world_size=2):
        assert summed == [3.0, 20.0] and later == [1.0] and sent == [10.0]
        assert calls == [False, True, False]


def _host_tensors_on_nccl():
    import torch

    import deepspeed.comm as dist

    flag = torch.tensor([2.0])
    dist.all_reduce(flag)
    work = dist.all_reduce(torch.ones(3), async_op=True)
    work.wait()
    sent = torch.tensor([5.0])
    dist.broadcast(sent, src=0)
    return dist.get_backend(), flag.tolist(), sent.tolist()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (NCCL)")
def test_host_tensors_on_nccl(dist_pool):
    [(backend, flag, sent)] = dist_pool.run(_host_tensors_on_nccl, world_size=1)
    assert backend == "nccl" and flag == [2.0] and sent == [5.0]
