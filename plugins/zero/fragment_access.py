"""Reading and writing one parameter's share of the ZeRO optimizer's partitioned fp32 state.

This is the optimizer side of ``deepspeed.utils.safe_get_full_fp32_param`` and friends
(``deepspeed.utils.tensor_fragment``, which finds it through the parameter's
``deepspeed.hooks.PARAM_STATE_ACCESS`` attribute).

Under every stage a rank owns one *contiguous* range of each flattened parameter (possibly
empty): stages 1/2 pack parameters into buckets whose pieces are contiguous ranges, and a
parameter is a contiguous range of its bucket; stage 3 makes every parameter its own bucket.
So this rank's *fragment* of a parameter is ``flat[start:start + length]``, it sits at one
offset of this rank's flat partition of the param group, and concatenating the fragments of all
ranks in rank order gives the whole parameter. A fragment may still span several fp32 master
chunks (``sub_group_size``), which NVMe offload keeps on disk: each chunk is swapped in around
the access and out again.

"full" methods are collectives over the data-parallel group (every rank must call them; a
param group partitioned over its own process group, experts', reduces over that one);
"local" ones are not.
"""
from typing import NamedTuple

import torch

from deepspeed import comm as dist


class Fragment(NamedTuple):
    group: int  # optimizer param group
    bucket: object  # the layout bucket holding the parameter
    start: int  # first element of the flattened parameter this rank owns
    length: int  # how many (0: this rank owns none of it)
    partition_offset: int  # where the fragment starts in this rank's partition of ``group``
    piece_offset: int  # where it starts in this rank's piece of ``bucket``


def _full_numel(param):
    return param.ds_numel if hasattr(param, "ds_id") else param.numel()


def _full_shape(param):
    return tuple(param.ds_shape) if hasattr(param, "ds_id") else tuple(param.shape)


class FragmentAccessMixin:
    """Fragment access for ``DeepSpeedZeroOptimizer`` (uses its ``layouts``, ``chunks``,
    ``grad_partitions``, ``optimizer``, ``group_comms``, ``_rank_in`` and
    ``_swap_in/_swap_out``).

    ``optim_state_key`` None means the fp32 master weights, else a per-element state of the
    basic optimizer (``"exp_avg"``, ``"exp_avg_sq"``, ...)."""

    # ------------------------------------------------------------------ getters
    def get_full_hp_param(self, param, optim_state_key=None):
        """Collective: the whole fp32 master (or optimizer state), in the parameter's full shape."""
        frag = self.fragment_of(param)
        return self._assemble(param, frag, self._read(param, frag, optim_state_key))

    def get_local_hp_param(self, param, optim_state_key=None):
        """This rank's fragment (1-D, possibly empty) of the fp32 master or optimizer state."""
        frag = self.fragment_of(param)
        return self._read(param, frag, optim_state_key)

    def get_full_hp_grad(self, param):
        """Collective: the whole reduced fp32 gradient (valid after backward, before step)."""
        frag = self.fragment_of(param)
        return self._assemble(param, frag, self.get_local_hp_grad(param))

    def get_local_hp_grad(self, param):
        frag = self.fragment_of(param)
        grad = param.grad
        if grad is not None and grad.numel() == _full_numel(param):
            # stage 1 inside an accumulation window: the unreduced local gradient
            return grad.detach().reshape(-1).narrow(0, frag.start, frag.length).float().clone()
        return self.grad_partitions[frag.group].narrow(
            0, frag.partition_offset, frag.length).clone()

    # ------------------------------------------------------------------ setters
    def set_full_hp_param(self, value, param, optim_state_key=None):
        """Collective: each rank keeps its fragment of the full-shape ``value``. Setting the
        master (no key) also updates the model's weights, so the next forward sees it."""
        value = self._checked(value, _full_numel(param), param, "full")
        frag = self.fragment_of(param)
        local = value.reshape(-1).narrow(0, frag.start, frag.length)
        self._write(param, frag, optim_state_key, local)
        if optim_state_key is None:
            self._write_model(param, frag, local, publish=True)

    def set_local_hp_param(self, value, param, optim_state_key=None):
        """Set this rank's fragment only (not a collective). Under ZeRO-3 ``value`` may also
        have the size of ``param.ds_tensor`` (its padding is ignored). Other ranks' copies of a
        stage 1/2 parameter see the change after the next step publishes the weights."""
        frag = self.fragment_of(param)
        sizes = [frag.length]
        if hasattr(param, "ds_tensor"):
            sizes.append(param.ds_tensor.numel())
        value = self._checked(value, sizes, param, "local")
        local = value.reshape(-1).narrow(0, 0, frag.length)
        self._write(param, frag, optim_state_key, local)
        if optim_state_key is None:
            self._write_model(param, frag, local, publish=False)

    def set_full_hp_grad(self, value, param):
        """Replace the gradient the next step uses by the full-shape ``value`` (each rank keeps
        its fragment, so not a collective): inside a stage-1 accumulation window the unreduced
        ``param.grad`` (the boundary then averages it), else this rank's reduced partition."""
        value = self._checked(value, _full_numel(param), param, "full gradient")
        grad = param.grad
        if grad is not None and grad.numel() == _full_numel(param):
            with torch.no_grad():
                grad.copy_(value.reshape(grad.shape))
            return
        frag = self.fragment_of(param)
        self._write_grad(frag, value.reshape(-1).narrow(0, frag.start, frag.length))

    def set_local_hp_grad(self, value, param):
        """Replace this rank's fragment of that gradient (where ``get_local_hp_grad`` reads)."""
        frag = self.fragment_of(param)
        value = self._checked(value, frag.length, param, "local gradient").reshape(-1)
        grad = param.grad
        if grad is not None and grad.numel() == _full_numel(param):
            with torch.no_grad():
                grad.view(-1).narrow(0, frag.start, frag.length).copy_(value)
            return
        self._write_grad(frag, value)

    def _write_grad(self, frag, local):
        with torch.no_grad():
            self.grad_partitions[frag.group].narrow(0, frag.partition_offset,
                                                    frag.length).copy_(local)

    def refresh_fp32_param(self, param):
        """Re-derive this rank's fp32 master fragment of ``param`` from the model's weights
        (after something wrote the weights directly, e.g. ``GatheredParameters``)."""
        frag = self.fragment_of(param)
        piece = frag.bucket.piece_of(self._rank_in(frag.bucket)).narrow(
            0, frag.piece_offset, frag.length)
        local = piece.detach().float().clone()
        frag.bucket.settle()
        self._write(param, frag, None, local)

    # ------------------------------------------------------------------ where a fragment lives
    def fragment_of(self, param):
        index = self.__dict__.get("_fragment_index")
        if index is None or index[0] is not self.layouts:
            index = (self.layouts, self._index_fragments())
            self._fragment_index = index
        frag = index[1].get(id(param))
        if frag is None:
            raise ValueError(f"parameter {self._name(param)} is not managed by this ZeRO "
                             f"optimizer (frozen, or not in its param groups)")
        return frag

    def _index_fragments(self):
        out = {}
        for group, layout in enumerate(self.layouts):
            for bucket in layout.buckets:
                rank = self._rank_in(bucket)
                lo, hi = rank * bucket.piece, (rank + 1) * bucket.piece
                for param, offset in zip(bucket.params, bucket.offsets):
                    first = max(offset, lo)
                    length = max(min(offset + _full_numel(param), hi) - first, 0)
                    if not length:
                        first = lo
                    out[id(param)] = Fragment(group, bucket, first - offset if length else 0,
                                              length, bucket.partition_offset + first - lo,
                                              first - lo)
        return out

    def _chunk_spans(self, frag):
        """``(chunk, offset in chunk, offset in fragment, n)`` covering the fragment."""
        spans = []
        lo, hi = frag.partition_offset, frag.partition_offset + frag.length
        chunks = self.chunks[frag.group]
        starts = [self._chunk_starts[id(c)][1] for c in chunks]
        stops = starts[1:] + [self.layouts[frag.group].partition_numel]
        for chunk, start, stop in zip(chunks, starts, stops):
            a, b = max(lo, start), min(hi, stop)
            if a < b:
                spans.append((chunk, a - start, a - lo, b - a))
        return spans

    # ------------------------------------------------------------------ reads / writes
    def _read(self, param, frag, key):
        out = torch.zeros(frag.length, dtype=torch.float32, device=self.master_device)
        for chunk, at, pos, n in self._chunk_spans(frag):
            self._swap_in(chunk)
            try:
                out.narrow(0, pos, n).copy_(self._target(chunk, key, param).narrow(0, at, n))
            finally:
                self._swap_out(chunk)
        return out

    def _write(self, param, frag, key, local):
        with torch.no_grad():
            for chunk, at, pos, n in self._chunk_spans(frag):
                self._swap_in(chunk)
                try:
                    target = self._target(chunk, key, param).narrow(0, at, n)
                    target.copy_(local.narrow(0, pos, n).to(target.device, target.dtype))
                finally:
                    self._swap_out(chunk)

    def _target(self, chunk, key, param):
        if key is None:
            return chunk.data.view(-1)
        state = self.optimizer_for(chunk).state.get(chunk) or {}
        value = state.get(key)
        if not torch.is_tensor(value) or value.numel() != chunk.numel():
            per_element = sorted(k for k, v in state.items()
                                 if torch.is_tensor(v) and v.numel() == chunk.numel())
            why = (f"per-element states are {per_element}" if state else
                   "the optimizer creates its state at the first step")
            raise ValueError(f"optimizer state {key!r} of parameter {self._name(param)} is not "
                             f"available: {why}")
        return value.view(-1)

    def _write_model(self, param, frag, local, publish):
        """Put the new master values into the model's weights: this rank's piece always;
        with ``publish`` (a collective) the whole parameter wherever it is held whole."""
        with torch.no_grad():
            piece = frag.bucket.piece_of(self._rank_in(frag.bucket)).narrow(
                0, frag.piece_offset, frag.length)
            piece.copy_(local.to(piece.device, piece.dtype))
            frag.bucket.settle()  # an NVMe-offloaded ZeRO-3 shard goes back to disk
            whole = not hasattr(param, "ds_id") or param.ds_status.name == "AVAILABLE"
            if not whole:
                return
            if publish:
                param.data.copy_(self._assemble(param, frag, local).to(param.dtype))
            else:
                param.data.view(-1).narrow(0, frag.start, frag.length).copy_(local)

    def _assemble(self, param, frag, local):
        """Every rank's fragment into one full-shape fp32 tensor (fragments are disjoint, so a
        sum of zero-padded copies is exact)."""
        device = frag.bucket.device
        full = torch.zeros(_full_numel(param), dtype=torch.float32, device=device)
        full.narrow(0, frag.start, frag.length).copy_(local)
        group, _, world, _ = self.group_comms[frag.group]  # experts: their own group
        if world > 1:
            dist.all_reduce(full, group=group)
        return full.view(_full_shape(param))

    def _checked(self, value, sizes, param, kind):
        sizes = sizes if isinstance(sizes, list) else [sizes]
        value = torch.as_tensor(value)
        if value.numel() not in sizes:
            raise ValueError(f"{kind} value for parameter {self._name(param)} has "
                             f"{value.numel()} elements (shape {tuple(value.shape)}); expected "
                             f"{' or '.join(map(str, sizes))} (full shape {_full_shape(param)})")
        return value.detach()

    def _name(self, param):
        return repr(self.param_names.get(id(param), f"<shape {tuple(_full_shape(param))}>"))
