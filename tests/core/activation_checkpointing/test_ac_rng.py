"""The RNG tracker, the model-parallel seeding scheme, and their use inside checkpointed code."""
import pytest
import torch

import deepspeed.checkpointing as ckpt
from deepspeed.accelerator import get_accelerator

# The tracker drives the accelerator's generator (torch's CPU generator on the CPU accelerator).
DEVICE = get_accelerator().current_device_name()


def _rand(n, seed=None):
    generator = None if seed is None else torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.rand(n, device=DEVICE, generator=generator)


def test_tracker_is_a_process_wide_singleton():
    assert ckpt.get_cuda_rng_tracker() is ckpt.get_cuda_rng_tracker()
    assert isinstance(ckpt.get_cuda_rng_tracker(), ckpt.CudaRNGStatesTracker)


def test_fork_runs_on_the_named_stream_and_leaves_the_outer_stream_alone():
    tracker = ckpt.CudaRNGStatesTracker()
    get_accelerator().manual_seed(99)
    tracker.add("a", 1)

    with tracker.fork("a"):
        r1 = _rand(4)
    outer = _rand(4)
    with tracker.fork("a"):
        r2 = _rand(4)

    # two draws of 4 from a generator seeded 1 (not one draw of 8: CUDA's Philox generator
    # advances its offset per launch, so 4 + 4 differs from 8 there)
    stream_a = torch.Generator(device=DEVICE).manual_seed(1)
    assert torch.equal(r1, torch.rand(4, device=DEVICE, generator=stream_a))
    assert torch.equal(r2, torch.rand(4, device=DEVICE, generator=stream_a))  # it continued
    assert torch.equal(outer, _rand(4, seed=99))  # add and fork left the outer stream alone


def test_fork_restores_the_outer_state_when_the_block_raises():
    tracker = ckpt.CudaRNGStatesTracker()
    tracker.add("a", 1)
    before = get_accelerator().get_rng_state()
    with pytest.raises(ZeroDivisionError):
        with tracker.fork("a"):
            _rand(3)
            raise ZeroDivisionError
    assert torch.equal(get_accelerator().get_rng_state(), before)


def test_tracker_errors():
    tracker = ckpt.CudaRNGStatesTracker()
    tracker.add("a", 1)
    with pytest.raises(Exception, match="seed 1 already exists"):
        tracker.add("b", 1)
    with pytest.raises(Exception, match="cuda rng state a already exists"):
        tracker.add("a", 2)
    with pytest.raises(Exception, match="cuda rng state nope is not added"):
        with tracker.fork("nope"):
            pass
    with pytest.raises(TypeError, match="get_states"):
        tracker.set_states([1, 2])


def test_get_set_reset_states():
    tracker = ckpt.CudaRNGStatesTracker()
    tracker.add("a", 3)
    snapshot = tracker.get_states()
    with tracker.fork("a"):
        first = _rand(5)
    assert not torch.equal(tracker.get_states()["a"], snapshot["a"])  # snapshot is a copy

    tracker.set_states(snapshot)
    with tracker.fork("a"):
        again = _rand(5)
    assert torch.equal(first, again)

    tracker.reset()
    assert tracker.get_states() == {}
    tracker.add("a", 3)  # name and seed are free again


def test_model_parallel_seed_without_mpu():
    ckpt.model_parallel_cuda_manual_seed(1234)
    default_draw = _rand(4)
    with ckpt.get_cuda_rng_tracker().fork():
        mp_draw = _rand(4)
    assert torch.equal(default_draw, _rand(4, seed=1234))
    assert torch.equal(mp_draw, _rand(4, seed=1234 + 2718))
    with pytest.raises(TypeError, match="int seed"):
        ckpt.model_parallel_cuda_manual_seed("1234")


def _tracker_dropout_segment(layer, x):
    with ckpt.get_cuda_rng_tracker().fork():
        h = torch.nn.functional.dropout(layer(x), p=0.5, training=True)
    return torch.nn.functional.dropout(h, p=0.25, training=True)  # default stream


def test_checkpoint_replays_the_tracker_streams():
    torch.manual_seed(0)
    layer = torch.nn.Linear(6, 6).to(DEVICE)  # on the device whose generator the tracker drives
    x0 = torch.randn(5, 6).to(DEVICE)

    def run(use_checkpoint):
        layer.zero_grad(set_to_none=True)
        ckpt.model_parallel_cuda_manual_seed(77)
        x = x0.clone().requires_grad_()
        h = x
        for _ in range(2):
            h = (ckpt.checkpoint(_tracker_dropout_segment, layer, h) if use_checkpoint
                 else _tracker_dropout_segment(layer, h))
        h.sum().backward()
        return (h.detach(), x.grad, layer.weight.grad.clone(),
                ckpt.get_cuda_rng_tracker().get_states(), get_accelerator().get_rng_state())

    ref, got = run(False), run(True)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    assert torch.equal(got[2], ref[2])
    # the recompute's draws from both streams were undone
    assert torch.equal(got[3]["model-parallel-rng"], ref[3]["model-parallel-rng"])
    assert torch.equal(got[4], ref[4])
