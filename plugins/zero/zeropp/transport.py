"""Quantized parameter all-gathers (qwZ, MixZ++): what travels is int8 plus one fp32 scale per
block, about a quarter of fp32's bytes and half of bf16/fp16's.

``QuantizedAllGather`` quantizes a send buffer at run time (qwZ); ``PackedRoute`` gathers shards
that are *stored* quantized (MixZ++ frozen weights, hpZ copies of them), with no quantization
at gather time. Both decode into a rank-major output, as ``shard_comm.Route`` promises.
"""
import torch

from deepspeed import comm as dist
from deepspeed.zero.shard_comm import Route
from deepspeed.zero.zeropp.quantize import WEIGHT_BLOCK, dequantize_rows, quantize_packed


class _Decode:
    """The work of a quantized all-gather: ``wait`` finishes the collective, then writes every
    rank's dequantized piece(s) into ``output`` (once)."""

    def __init__(self, work, received, output, world, parts, block, bits):
        self.work, self.received, self.output = work, received, output
        self.world, self.parts, self.block, self.bits = world, parts, block, bits

    def wait(self):
        if self.received is None:
            return
        if self.work is not None and hasattr(self.work, "wait"):
            self.work.wait()
        rows = self.received.view(self.world, -1)
        out = self.output.view(self.world, -1)
        byte_at = elem_at = 0
        for nbytes, numel in self.parts:  # one part per separately quantized buffer
            chunk = rows[:, byte_at:byte_at + nbytes].contiguous().view(-1)
            out[:, elem_at:elem_at + numel].copy_(
                dequantize_rows(chunk, self.world, numel, self.block, self.bits, out.dtype))
            byte_at += nbytes
            elem_at += numel
        self.work = self.received = None


def _gather_bytes(send, world, group, async_op):
    if world == 1:
        return send, None
    received = torch.empty(send.numel() * world, dtype=torch.uint8, device=send.device)
    return received, dist.all_gather_into_tensor(received, send, group=group, async_op=async_op)


class QuantizedAllGather:
    """A ``Route`` transport: quantize the send buffer, all-gather the bytes, decode on wait."""

    def __init__(self, block=WEIGHT_BLOCK, bits=8):
        self.block, self.bits = block, bits

    def __call__(self, output, send, group, async_op):
        world = output.numel() // send.numel()
        packed = quantize_packed(send, self.block, self.bits)
        received, work = _gather_bytes(packed, world, group, async_op)
        return _Decode(work, received, output, world, [(packed.numel(), send.numel())],
                       self.block, self.bits)


class PackedRoute(Route):
    """Gathers shards stored quantized: ``payload(param)`` is the packed bytes of
    ``numel_of(param)`` elements, one block grid per parameter."""

    def __init__(self, group, payload, numel_of, on_gathered=None, block=WEIGHT_BLOCK, bits=8):
        super().__init__(group, on_gathered=on_gathered)
        self.payload, self.numel_of = payload, numel_of
        self.block, self.bits = block, bits

    def start(self, partitioner, params, dtype, device, async_op):
        payloads = [self.payload(p).to(device) for p in params]
        sizes = [self.numel_of(p) for p in params]
        send = torch.cat(payloads)
        received, work = _gather_bytes(send, self.world_size, self.group, async_op)
        output = torch.empty(self.world_size * sum(sizes), dtype=dtype, device=device)
        parts = [(b.numel(), n) for b, n in zip(payloads, sizes)]
        return send, output, _Decode(work, received, output, self.world_size, parts, self.block,
                                     self.bits), sizes
