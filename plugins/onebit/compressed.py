"""The error-compensated 1-bit all-reduce that replaces the gradient all-reduce after warm-up.

For each tensor ``x`` (padded with zeros to ``n``, a multiple of ``P * divider`` where
``divider = P * 8 / gcd(P, 8)``, so every rank's chunk packs into whole bytes) on ``P`` ranks:

1. worker:  ``y = x + e_w``;  ``s_w = ||y|| / sqrt(n)``;  ``c_w = s_w * sign⁺(y)``;  ``e_w = y - c_w``
2. the packed signs of chunk ``j`` go to rank ``j`` (all-to-all), every ``s_w`` to every rank
   (all-gather);
3. server (rank ``j``, its chunk):  ``z = mean_i(c_w,i) + e_s``;  ``s_s = ||z|| / sqrt(n / P)``;
   ``c_s = s_s * sign⁺(z)``;  ``e_s = z - c_s``
4. every server's packed signs and ``s_s`` go to every rank (all-gather); the result, the same
   on every rank, is ``c_s`` of each chunk, concatenated.

Error feedback makes the compression telescope: summed over steps, outputs plus
``mean_i(e_w,i) + e_s`` equal the summed true averages, so the error never accumulates.

All tensors of one call travel together (four collectives per step, not four per parameter),
each with its own scales: the scales are per tensor as in upstream's per-parameter compression,
so a layer with small momenta is not drowned by one with large ones.

Bytes a rank hands to the wire per call: ``n/8`` (all-to-all) + ``n/(8P)`` (server chunk) +
``8 * tensors`` (two fp32 scales per tensor), against ``4n`` for an fp32 all-reduce.
"""
import math

import torch

from deepspeed.onebit.packing import pack_signs, sign_plus, unpack_signs


def divider(world_size):
    """``P * 8 / gcd(P, 8)``: the least multiple of 8 that ``P`` divides."""
    return world_size * 8 // math.gcd(world_size, 8)


def padded_size(numel, world_size):
    """``numel`` rounded up to a multiple of ``world_size * divider(world_size)``."""
    unit = world_size * divider(world_size)
    return -(-numel // unit) * unit


class CompressedAllreduce:
    """Averages a fixed list of tensor shapes over ``transport``'s ranks, 1 bit per element,
    keeping the worker error (``(P, K)``: this rank's, in chunk layout) and the server error
    (``(K,)``: this rank's chunk) between calls. ``K`` is the sum of the per-rank chunk sizes.
    """

    def __init__(self, transport, shapes, device, dtype=torch.float32):
        self.transport = transport
        self.world_size = transport.world_size
        self.shapes = [torch.Size(s) for s in shapes]
        self.numels = [s.numel() for s in self.shapes]
        self.padded = [padded_size(n, self.world_size) for n in self.numels]
        self.chunks = [n // self.world_size for n in self.padded]
        self.offsets = [sum(self.chunks[:i]) for i in range(len(self.chunks))]
        self.width = sum(self.chunks)
        self.device, self.dtype = torch.device(device), dtype
        counts = torch.tensor(self.chunks, device=self.device)
        self._segment = torch.repeat_interleave(torch.arange(len(self.chunks),
                                                             device=self.device), counts)
        self._padded_n = torch.tensor(self.padded, dtype=dtype, device=self.device)
        self._chunk_n = torch.tensor(self.chunks, dtype=dtype, device=self.device)
        self.worker_error = torch.zeros(self.world_size, self.width, dtype=dtype,
                                        device=self.device)
        self.server_error = torch.zeros(self.width, dtype=dtype, device=self.device)

    def reset_errors(self):
        """Zero both error buffers (after a checkpoint load; 0/1 Adam when freezing starts)."""
        self.worker_error.zero_()
        self.server_error.zero_()

    # ------------------------------------------------------------------ layout
    def to_chunks(self, tensors):
        """``(P, K)``: row ``j`` holds chunk ``j`` of every tensor, padded with zeros."""
        rows = []
        for tensor, numel, size in zip(tensors, self.numels, self.padded):
            flat = tensor.detach().reshape(-1).to(self.dtype)
            if size != numel:
                flat = torch.cat([flat, flat.new_zeros(size - numel)])
            rows.append(flat.view(self.world_size, -1))
        return torch.cat(rows, dim=1)

    def from_chunks(self, chunked):
        """The inverse of ``to_chunks``: one tensor per shape, padding dropped."""
        out = []
        for shape, numel, offset, width in zip(self.shapes, self.numels, self.offsets,
                                               self.chunks):
            out.append(chunked[:, offset:offset + width].reshape(-1)[:numel].view(shape))
        return out

    def _scales(self, squares_by_column, counts):
        per_tensor = torch.zeros(len(self.chunks), dtype=self.dtype, device=self.device)
        per_tensor.index_add_(0, self._segment, squares_by_column)
        return (per_tensor / counts).sqrt_()

    # ------------------------------------------------------------------ the all-reduce
    def __call__(self, tensors):
        """The compressed average of ``tensors`` (one per shape) over all ranks, as new tensors
        of the same shapes; a single rank has nothing to average and gets them back unchanged."""
        if self.world_size == 1:
            return [t.detach().clone() for t in tensors]
        if len(tensors) != len(self.shapes):
            raise ValueError(f"compressed all-reduce built for {len(self.shapes)} tensors, "
                             f"called with {len(tensors)}")
        seg = self._segment
        worker = self.to_chunks(tensors).add_(self.worker_error)
        worker_scale = self._scales(worker.square().sum(dim=0), self._padded_n)
        self.worker_error = worker - worker_scale[seg] * sign_plus(worker)
        received = self.transport.all_to_all(pack_signs(worker))
        scales = self.transport.all_gather(worker_scale)  # (P, T)

        server = (unpack_signs(received, self.dtype) * scales[:, seg]).sum(dim=0)
        server.div_(self.world_size).add_(self.server_error)
        server_scale = self._scales(server.square(), self._chunk_n)
        self.server_error = server - server_scale[seg] * sign_plus(server)
        gathered = self.transport.all_gather(pack_signs(server))  # (P, K/8)
        server_scales = self.transport.all_gather(server_scale)  # (P, T)
        result = unpack_signs(gathered, self.dtype) * server_scales[:, seg]
        return self.from_chunks(result)
