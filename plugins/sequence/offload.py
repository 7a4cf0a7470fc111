"""Host offload for long-context training: FPDT chunk pool with a double buffer, and activation
(checkpointed hidden states) offload.

:class:`ChunkOffloader` keeps chunks that are not in use in host memory (pinned when they come
from an accelerator) and hands them back through a working buffer of two slots per role: while
the compute runs on the chunk in one slot, the next chunk is copied into the other
(:meth:`ChunkOffloader.sweep`). On CUDA the copies run on their own streams, ordered against the
compute stream with events, so transfers overlap compute. On CPU there is no copy engine: the
copy is synchronous, but it still goes into a separate host pool (counted as host bytes by
:mod:`deepspeed.sequence.memory`) and the working buffer is still bounded by two chunks per role.

:func:`get_checkpoint_hidden_states_offloading_ctx_manager` is a ``saved_tensors_hooks`` context
that moves large floating tensors saved for backward (with activation checkpointing those are
the checkpointed layers' inputs, the hidden states) into the host pool and brings them back in
backward.
"""
import torch

from deepspeed.sequence.memory import host_pool


def _nbytes(t):
    return t.numel() * t.element_size()


def _host_copy(tensor):
    """A copy of ``tensor`` in the host pool: pinned when it comes from an accelerator."""
    with host_pool():
        host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu",
                           pin_memory=tensor.device.type == "cuda")
        host.copy_(tensor, non_blocking=tensor.device.type == "cuda")
    return host


class ChunkOffloader:
    """Host pool for chunks not in use, with a double-buffered working area per role.

    ``store(t)`` keeps a host copy and returns its key; ``fetch(key, role)`` returns the chunk in
    one of the two working slots of ``role`` ("k", "v", "q", "out"), using the copy started by
    ``prefetch(key, role)`` when there is one. ``max_working_bytes`` records the largest working
    area (at most two chunks per role); ``bytes_to_host`` / ``bytes_to_device`` count transfers.
    With ``enabled=False`` chunks are kept as they are and ``fetch`` returns them.
    """

    def __init__(self, enabled):
        self.enabled = enabled
        self.host = []  # key -> (host tensor, device, ready event or None)
        self.slots = {}  # role -> [slot0, slot1]
        self.turn = {}  # role -> index of the slot the next copy goes to
        self.pending = {}  # role -> (key, slot index, event or None)
        self.max_working_bytes = 0
        self.bytes_to_host = self.bytes_to_device = 0
        self._d2h = self._h2d = None

    def _streams(self, device):
        if device.type != "cuda":
            return None, None
        if self._d2h is None:
            self._d2h, self._h2d = torch.cuda.Stream(device), torch.cuda.Stream(device)
        return self._d2h, self._h2d

    def store(self, tensor):
        if not self.enabled:
            self.host.append((tensor, tensor.device, None))
            return len(self.host) - 1
        d2h, _ = self._streams(tensor.device)
        event = None
        if d2h is not None:
            d2h.wait_stream(torch.cuda.current_stream(tensor.device))
            with torch.cuda.stream(d2h):
                host = _host_copy(tensor)
                event = torch.cuda.Event()
                event.record(d2h)
            tensor.record_stream(d2h)  # the source lives until the copy has read it
        else:
            host = _host_copy(tensor)
        self.bytes_to_host += _nbytes(tensor)
        self.host.append((host, tensor.device, event))
        return len(self.host) - 1

    def _slot(self, role, host, device):
        slots = self.slots.setdefault(role, [None, None])
        index = self.turn.get(role, 0)
        self.turn[role] = 1 - index
        buf = slots[index]
        if buf is None or buf.shape != host.shape or buf.dtype != host.dtype:
            buf = slots[index] = torch.empty(host.shape, dtype=host.dtype, device=device)
            self.max_working_bytes = max(self.max_working_bytes, sum(
                _nbytes(b) for pair in self.slots.values() for b in pair if b is not None))
        return index, buf

    def prefetch(self, key, role):
        """Start copying chunk ``key`` into the free slot of ``role``."""
        if not self.enabled:
            return
        host, device, stored = self.host[key]
        _, h2d = self._streams(device)
        index, buf = self._slot(role, host, device)
        event = None
        if h2d is not None:
            # the slot's previous chunk may still be read by compute queued on the main stream
            h2d.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(h2d):
                if stored is not None:
                    h2d.wait_event(stored)
                buf.copy_(host, non_blocking=True)
                event = torch.cuda.Event()
                event.record(h2d)
        else:
            buf.copy_(host)
        self.bytes_to_device += _nbytes(host)
        self.pending[role] = (key, index, event)

    def fetch(self, key, role):
        host, device, _ = self.host[key]
        if not self.enabled:
            return host
        if self.pending.get(role, (None,))[0] != key:
            self.prefetch(key, role)
        _, index, event = self.pending.pop(role)
        if event is not None:
            torch.cuda.current_stream(device).wait_event(event)
        return self.slots[role][index]

    def sweep(self, keys, role):
        """Yield the chunks of ``keys`` in order, copying the next while the current is used."""
        keys = list(keys)
        for n, key in enumerate(keys):
            buf = self.fetch(key, role)
            if n + 1 < len(keys):
                self.prefetch(keys[n + 1], role)
            yield buf


class _OffloadSavedTensors(torch.autograd.graph.saved_tensors_hooks):
    """Saved floating tensors of at least ``min_numel`` elements that live on the compute device
    go to the host pool; parameters and small tensors stay where they are."""

    def __init__(self, min_numel):
        self.min_numel = min_numel
        self.offloaded_bytes = 0
        self.offloaded_count = 0
        super().__init__(self._pack, self._unpack)

    def __enter__(self):
        super().__enter__()
        return self

    def _pack(self, tensor):
        if (isinstance(tensor, torch.nn.Parameter) or not tensor.is_floating_point()
                or tensor.numel() < self.min_numel or not _on_compute_device(tensor)):
            return tensor
        self.offloaded_bytes += _nbytes(tensor)
        self.offloaded_count += 1
        return (tensor.device, _host_copy(tensor))

    @staticmethod
    def _unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        return host.to(device, non_blocking=host.is_pinned())


def _on_compute_device(tensor):
    """On a CPU-only machine every tensor is on the compute device (the offload is a copy to the
    separate host pool); with an accelerator, tensors already on the host are left alone (for
    example those the activation-checkpointing ``cpu_checkpointing`` path moved there)."""
    from deepspeed.accelerator import get_accelerator
    name = get_accelerator().device_name()
    return tensor.device.type == torch.device(name).type


def get_checkpoint_hidden_states_offloading_ctx_manager(num_layers=None, model=None,
                                                        min_numel=None):
    """A context manager to wrap the forward pass: tensors saved for backward inside it are kept
    in host memory until backward needs them. Combined with activation checkpointing (each
    layer saves only its input), this moves the hidden states of every layer off the device.

    ``min_numel`` (default: the model's ``hidden_size`` when ``model`` has a config, else 1024)
    skips small tensors (rotary tables, masks, scalars) whose round trip is not worth it.
    ``num_layers`` is accepted for upstream compatibility; every saved tensor is considered.
    """
    if num_layers is not None and (isinstance(num_layers, bool) or not isinstance(num_layers, int)
                                   or num_layers < 0):
        raise ValueError(f"num_layers must be a non-negative int, got {num_layers!r}")
    if min_numel is None:
        config = getattr(model, "config", None)
        min_numel = getattr(config, "hidden_size", None) or 1024
    if isinstance(min_numel, bool) or not isinstance(min_numel, int) or min_numel < 1:
        raise ValueError(f"min_numel must be a positive int, got {min_numel!r}")
    return _OffloadSavedTensors(min_numel)
