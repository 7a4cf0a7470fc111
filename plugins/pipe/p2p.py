"""Activations forward and their gradients backward between adjacent pipeline stages.

A stage's output may be one tensor or a tuple of tensors, some of them not floating point (an
attention mask) and so carrying no gradient. The first transfer in each direction after
``reset`` is preceded by a description of what follows (how many tensors, each one's dtype,
shape and whether it requires a gradient); later transfers reuse it, so a step costs one
message per tensor. A sender whose tensors no longer match the description it sent raises
``PipelineError`` naming both shapes instead of letting the receiver read garbage: shapes may
change only after ``PipelineEngine.reset_activation_shape()`` on every rank.

Everything goes through ``deepspeed.comm`` blocking ``send`` / ``recv`` between global ranks;
the schedules pair every send with a receive in the same step, so blocking cannot deadlock.

With tensor parallelism inside a stage, every tensor-parallel rank of a stage holds the same
activation and sends it to its peer (same tensor slice) on the next stage. A ``TensorSplit``
(the config's ``pipeline.pipe_partitioned`` / ``grad_partitioned``) makes each send only its
``1/tp`` share of every floating-point tensor; the receiving stage all-gathers the shares over
its own tensor-parallel group. ``sent_bytes`` counts what this rank sent.
"""
from dataclasses import dataclass


import torch

from deepspeed import comm as dist

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]


class PipelineError(Exception):
    """Misuse of a pipeline engine (upstream's name)."""


def _as_tuple(value):
    if torch.is_tensor(value):
        return (value,), False
    if isinstance(value, (tuple, list)) and all(torch.is_tensor(v) for v in value):
        return tuple(value), True
    raise PipelineError(f"a pipeline stage must pass a tensor or a tuple of tensors to the next "
                        f"stage, got {type(value).__name__}"
                        + (f" holding {[type(v).__name__ for v in value]}"
                           if isinstance(value, (tuple, list)) else ""))


def describe(value):
    """``(is_tuple, [(dtype, shape, requires_grad), ...])`` of a stage's output."""
    tensors, is_tuple = _as_tuple(value)
    return is_tuple, [(t.dtype, tuple(t.shape), bool(t.requires_grad and t.is_floating_point()))
                      for t in tensors]


def _encode(description):
    is_tuple, items = description
    flat = [int(is_tuple), len(items)]
    for dtype, shape, requires_grad in items:
        flat += [DTYPES.index(dtype), int(requires_grad), len(shape), *shape]
    return torch.tensor(flat, dtype=torch.int64)


def _decode(flat):
    values = flat.tolist()
    is_tuple, count, pos, items = bool(values[0]), values[1], 2, []
    for _ in range(count):
        dtype, requires_grad, ndim = DTYPES[values[pos]], bool(values[pos + 1]), values[pos + 2]
        items.append((dtype, tuple(values[pos + 3:pos + 3 + ndim]), requires_grad))
        pos += 3 + ndim
    return is_tuple, items


def _wire(tensor):
    """gloo moves bytes of its own dtypes; bool travels as uint8."""
    tensor = tensor.detach().contiguous()
    return tensor.to(torch.uint8) if tensor.dtype == torch.bool else tensor


@dataclass(frozen=True)
class TensorSplit:
    """A stage's tensor-parallel ranks (``group`` of ``size``, this one ``rank``) each carry a
    ``1/size`` share of what crosses the stage boundary."""

    group: object
    size: int
    rank: int

    def share(self, tensor):
        """This rank's share of ``tensor`` (flattened, zero-padded to ``size`` equal parts)."""
        flat = tensor.reshape(-1)
        part = -(-flat.numel() // self.size)
        padded = torch.zeros(part * self.size, dtype=flat.dtype, device=flat.device)
        padded[:flat.numel()] = flat
        return padded[self.rank * part:(self.rank + 1) * part]

    def share_like(self, shape, dtype, device):
        """An empty buffer for one share of a tensor of ``shape``."""
        numel = 1
        for dim in shape:
            numel *= dim
        return torch.empty(-(-numel // self.size), dtype=dtype, device=device)

    def gather(self, share, shape):
        """The whole tensor from every rank's ``share`` (collective over ``group``)."""
        whole = torch.empty(share.numel() * self.size, dtype=share.dtype, device=share.device)
        dist.all_gather_into_tensor(whole, share, group=self.group)
        numel = 1
        for dim in shape:
            numel *= dim
        return whole[:numel].view(shape)


def _splits(tensor, split):
    return split is not None and tensor.is_floating_point()


class StageLink:
    """This rank's transfers to the previous and next stage of its pipeline; ``activations`` /
    ``grads``: the ``TensorSplit`` each direction travels in, None to send whole tensors."""

    def __init__(self, prev_rank=None, next_rank=None, device="cpu", activations=None,
                 grads=None):
        self.prev_rank, self.next_rank, self.device = prev_rank, next_rank, device
        self.activation_split, self.grad_split = activations, grads
        self.sent_bytes = 0
        self.reset()

    def _send(self, tensor, dst, split):
        wire = _wire(tensor)
        if _splits(wire, split):
            wire = split.share(wire)
        self.sent_bytes += wire.numel() * wire.element_size()
        dist.send(wire, dst)

    def _recv(self, shape, dtype, src, split):
        if split is not None and dtype.is_floating_point:
            share = split.share_like(shape, dtype, self.device)
            dist.recv(share, src)
            return split.gather(share, shape)
        buffer = torch.empty(shape, dtype=dtype, device=self.device)
        dist.recv(buffer, src)
        return buffer

    def reset(self):
        """Forget the descriptions: the next transfer in each direction describes itself."""
        self.sent = None  # what we last told the next stage we send
        self.received = None  # what the previous stage told us it sends

    # ------------------------------------------------------------------ activations
    def send_activations(self, value):
        description = describe(value)
        if self.sent is None:
            meta = _encode(description)
            dist.send(torch.tensor([meta.numel()], dtype=torch.int64), self.next_rank)
            dist.send(meta, self.next_rank)
            self.sent = description
        elif description != self.sent:
            raise PipelineError(
                f"this stage's output changed from {_shapes(self.sent)} to "
                f"{_shapes(description)} without reset_activation_shape(); call "
                f"engine.reset_activation_shape() on every rank when shapes change (e.g. a new "
                f"sequence length)")
        for tensor in _as_tuple(value)[0]:
            self._send(tensor, self.next_rank, self.activation_split)

    def recv_activations(self):
        """The previous stage's output, as fresh tensors; floating ones that carried a gradient
        there require one here, so ``send_grads`` can return it."""
        if self.received is None:
            size = torch.zeros(1, dtype=torch.int64)
            dist.recv(size, self.prev_rank)
            meta = torch.zeros(int(size.item()), dtype=torch.int64)
            dist.recv(meta, self.prev_rank)
            self.received = _decode(meta)
        is_tuple, items = self.received
        tensors = []
        for dtype, shape, requires_grad in items:
            wire_dtype = torch.uint8 if dtype == torch.bool else dtype
            buffer = self._recv(shape, wire_dtype, self.prev_rank, self.activation_split)
            tensor = buffer.to(dtype) if dtype == torch.bool else buffer
            tensors.append(tensor.requires_grad_(requires_grad))
        return tuple(tensors) if is_tuple else tensors[0]

    # ------------------------------------------------------------------ gradients
    def send_grads(self, received):
        """The gradients of the activations ``recv_activations`` gave us, back to their sender
        (zeros for one the forward did not use)."""
        for tensor in _as_tuple(received)[0]:
            if tensor.requires_grad:
                grad = tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)
                self._send(grad, self.prev_rank, self.grad_split)

    def recv_grads(self, outputs):
        """Gradients for this stage's ``outputs`` from the next stage: a list aligned with the
        outputs that require a gradient (the others get none)."""
        grads = []
        for tensor in _as_tuple(outputs)[0]:
            if tensor.requires_grad and tensor.is_floating_point():
                grads.append(self._recv(tuple(tensor.shape), tensor.dtype, self.next_rank,
                                        self.grad_split))
        return grads


def _shapes(description):
    return [tuple(shape) for _, shape, _ in description[1]]
