"""Host offload: the FPDT chunk pool's double buffer and the hidden-state offload context
manager (measured with the tracked-bytes meter), and the transfer/compute overlap on a GPU."""
import pytest
import torch

from deepspeed.sequence.memory import TrackedTensorMemory, measure
from deepspeed.sequence.offload import (ChunkOffloader,
                                        get_checkpoint_hidden_states_offloading_ctx_manager)


def test_sweep_prefetches_the_next_chunk_into_the_other_slot():
    chunks = [torch.full((2, 4), float(i)) for i in range(5)]
    pool = ChunkOffloader(True)
    keys = [pool.store(c) for c in chunks]
    seen, slots = [], []
    for n, buf in enumerate(pool.sweep(keys, "k")):
        seen.append(buf.clone())
        slots.append(buf.data_ptr())
        if n + 1 < len(keys):  # the next chunk is already in flight (here: copied) for this role
            assert pool.pending["k"][0] == keys[n + 1]
    assert all(torch.equal(a, b) for a, b in zip(seen, chunks))
    assert len(set(slots)) == 2 and slots[0] == slots[2]  # two slots, used in turn
    assert pool.max_working_bytes == 2 * chunks[0].numel() * 4
    assert pool.bytes_to_host == pool.bytes_to_device == 5 * 32


def test_chunk_pool_is_host_bytes_and_the_working_area_stays_two_chunks():
    chunk = torch.randn(64, 256)  # 64 KiB
    n = 16
    with TrackedTensorMemory() as mem:
        pool = ChunkOffloader(True)
        keys = [pool.store(chunk) for _ in range(n)]
        for _ in pool.sweep(keys, "k"):
            pass
    chunk_bytes = chunk.numel() * 4
    assert mem.peak_host == n * chunk_bytes  # everything offloaded sits in the host pool
    assert mem.peak_device <= 2 * chunk_bytes  # the double buffer, whatever n is


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x):
        return x + self.b(torch.relu(self.a(x)))


def _train(offload, checkpoint):
    from torch.utils.checkpoint import checkpoint as ckpt
    from deepspeed.accelerator import get_accelerator
    device = get_accelerator().current_device_name()  # the offload moves what is there
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(_Block() for _ in range(4)).to(device)
    x = torch.randn(8, 128, 64).to(device).requires_grad_()
    ctx = get_checkpoint_hidden_states_offloading_ctx_manager(model=None, min_numel=1024) \
        if offload else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)

    def step():
        with ctx:
            h = x
            for block in blocks:
                h = ckpt(block, h, use_reentrant=True) if checkpoint else block(h)
            loss = h.square().mean()
        loss.backward()
        return loss.item()

    loss, mem = measure(step)
    return loss, [x.grad] + [p.grad for p in blocks.parameters()], mem, ctx


def test_hidden_state_offload_keeps_gradients_and_moves_the_saved_inputs_to_the_host():
    want_loss, want_grads, plain, _ = _train(offload=False, checkpoint=True)
    loss, grads, offloaded, ctx = _train(offload=True, checkpoint=True)
    assert loss == want_loss
    for a, b in zip(grads, want_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    hidden = 8 * 128 * 64 * 4
    # one input per checkpointed layer, and the last hidden state the loss's square() saves
    assert ctx.offloaded_count == 5 and ctx.offloaded_bytes == 5 * hidden
    assert offloaded.peak_host >= 5 * hidden
    assert offloaded.peak_device < plain.peak_device


def test_offload_ctx_manager_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_layers must be a non-negative int, got -1"):
        get_checkpoint_hidden_states_offloading_ctx_manager(num_layers=-1)
    with pytest.raises(ValueError, match="min_numel must be a positive int, got 0"):
        get_checkpoint_hidden_states_offloading_ctx_manager(min_numel=0)


def test_fpdt_hf_attention_refuses_what_it_cannot_do():
    from deepspeed.sequence.alst import FPDTAttentionHF
    attn = FPDTAttentionHF(chunk_size=8)
    q = torch.randn(1, 2, 16, 4)
    module = torch.nn.Module()
    with pytest.raises(NotImplementedError, match="takes no attention mask"):
        attn(module, q, q, q, torch.ones(1, 1, 16, 16))
    with pytest.raises(ValueError, match="chunk_size 32 is larger than the sequence length 16"):
        FPDTAttentionHF(chunk_size=32)(module, q, q, q, None)
    with pytest.raises(NotImplementedError, match="sliding_window=4"):
        attn(module, q, q, q, None, sliding_window=4)
    with pytest.raises(ValueError, match="FPDT chunk_size must be a positive int, got 0"):
        FPDTAttentionHF(chunk_size=0)
    out, _ = attn(module, q, q[:, :1], q[:, :1], None)  # one kv head for two query heads
    ref = torch.nn.functional.scaled_dot_product_attention(q, q[:, :1].expand_as(q),
                                                           q[:, :1].expand_as(q), is_causal=True)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_chunk_transfers_overlap_the_attention_compute():
    """On a GPU the FPDT chunk copies run on their own streams: the profiler shows host-to-device
    copies running while attention kernels run, and the result still equals full attention."""
    from torch.profiler import ProfilerActivity, profile
    from deepspeed.sequence.fpdt_core import chunked_causal_attention
    q, k, v = (torch.randn(1, 16384, 8, 64, device="cuda", requires_grad=True) for _ in range(3))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = chunked_causal_attention(q, k, v, 2048, offload=True)
        out.sum().backward()
        torch.cuda.synchronize()
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(t.detach().transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out.detach(), ref, rtol=2e-3, atol=2e-3)
    events = [e for e in prof.events() if e.device_type.name == "CUDA"]
    copies = [e for e in events if "Memcpy HtoD" in e.name]
    kernels = [e for e in events if "Memcpy" not in e.name and "Memset" not in e.name]
    assert copies and kernels
    overlapped = [c for c in copies if any(
        k.time_range.start < c.time_range.end and c.time_range.start < k.time_range.end
        for k in kernels)]
    assert overlapped, "no host-to-device chunk copy overlapped a compute kernel"
