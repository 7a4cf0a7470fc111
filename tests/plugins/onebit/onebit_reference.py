"""Plain-PyTorch references the onebit tests compare against, written from the documented
formulas and independent of ``deepspeed.onebit``'s code."""
import math

import torch

SHAPES = [(5, 3), (17,), (4, 8), (1,)]  # odd sizes: every tensor needs padding on 2 and 3 ranks


def padded(numel, world):
    unit = world * (world * 8 // math.gcd(world, 8))
    return -(-numel // unit) * unit


def sgn(x):
    return torch.where(x >= 0, 1.0, -1.0)


def rank_inputs(rank, step, shapes=SHAPES):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(s, generator=g) * (1 + i) for i, s in enumerate(shapes)]


class ReferenceCompressor:
    """The documented two-phase 1-bit all-reduce, simulated for all ``world`` ranks at once,
    per tensor, in the tensor's own element order."""

    def __init__(self, world, shapes=SHAPES):
        self.world, self.shapes = world, shapes
        self.n = [padded(math.prod(s), world) for s in shapes]
        self.worker = [[torch.zeros(n) for n in self.n] for _ in range(world)]
        self.server = [torch.zeros(n) for n in self.n]  # chunk j belongs to rank j

    def __call__(self, inputs):
        """``inputs[rank][t]`` -> the averaged tensors every rank receives."""
        out = []
        for t, (shape, n) in enumerate(zip(self.shapes, self.n)):
            numel, chunk = math.prod(shape), n // self.world
            compressed = []
            for rank in range(self.world):
                y = torch.zeros(n)
                y[:numel] = inputs[rank][t].reshape(-1)
                y += self.worker[rank][t]
                c = y.norm() / math.sqrt(n) * sgn(y)
                self.worker[rank][t] = y - c
                compressed.append(c)
            z = torch.stack(compressed).mean(0) + self.server[t]
            result = torch.empty(n)
            for j in range(self.world):
                part = z[j * chunk:(j + 1) * chunk]
                result[j * chunk:(j + 1) * chunk] = part.norm() / math.sqrt(chunk) * sgn(part)
            self.server[t] = z - result
            out.append(result[:numel].view(shape))
        return out
