"""ALST sequence tiling: run a sequence-local computation over sequence shards, one at a time.

An MLP (or an lm_head + loss) treats every token independently, so its activations for a long
sequence can be computed shard by shard. The autograd functions here run the forward under
``no_grad`` shard by shard (only the output is kept), and in backward recompute one shard at a
time with gradients enabled, so at any moment only one shard's intermediate activations are live.

Parameter gradients: the parameters ``fn`` trains (``compute_params``, plus the parameters of
``self`` when it is an ``nn.Module``) are not autograd inputs of these functions (under ZeRO-3
they are released placeholders when the function is applied). Backward sums the per-shard
parameter gradients itself and accumulates them into ``.grad`` with one
``torch.autograd.backward(params, grads)``, so each parameter's ``.grad`` is accumulated (and
its post-accumulate-grad hook, which ZeRO's gradient reduction uses, fires) exactly once per
backward, however many shards ran. As upstream, the parameter gradients therefore always land
in ``.grad`` (``torch.autograd.grad(loss, params)`` from outside does not see them).

The upstream import path is ``deepspeed.runtime.sequence_parallel.ulysses_sp``.
"""
import math

import torch

from deepspeed import comm as dist

__all__ = ["TiledMLP", "SequenceTiledCompute", "sequence_tiled_compute", "TiledFusedLogitsLoss",
           "tiled_mlp_num_shards"]


def tiled_mlp_num_shards(seqlen, hidden_size, group=None):
    """The ALST shard-count rule: ``ceil(seqlen / hidden_size)`` (at least 1), MAX-all-reduced
    over ``group`` when torch.distributed is initialised, so that every rank (in particular every
    ZeRO-3 rank, which gathers parameters inside each shard's forward) runs the same number of
    shards even when their sequence lengths differ."""
    if seqlen < 0 or hidden_size <= 0:
        raise ValueError(f"tiled MLP shard count needs seqlen >= 0 and hidden_size > 0, got "
                         f"seqlen={seqlen}, hidden_size={hidden_size}")
    shards = max(1, math.ceil(seqlen / hidden_size))
    if dist.is_initialized():
        t = torch.tensor([shards], dtype=torch.long)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        shards = int(t.item())
    return shards


def _check_shards(shards, what):
    if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
        raise ValueError(f"{what}: the shard count must be a positive int, got {shards!r}")


def _trainable_params(module, compute_params):
    """Unique parameters requiring grad: ``compute_params`` first, then ``module``'s own."""
    seen, params = set(), []
    candidates = list(compute_params or [])
    if isinstance(module, torch.nn.Module):
        candidates += list(module.parameters())
    for p in candidates:
        if isinstance(p, torch.Tensor) and p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            params.append(p)
    return params


def _split(tensor, shards, dim):
    """Exactly ``shards`` pieces (the first ones one longer when ``shards`` does not divide the
    length; empty ones when there are more shards than positions): every rank runs the same
    number of shard computations."""
    return torch.tensor_split(tensor, shards, dim=dim)


def _deliver(params, acc):
    """Accumulate the summed gradients into ``.grad`` once (one hook call per parameter)."""
    pairs = [(p, g) for p, g in zip(params, acc) if g is not None]
    if pairs:
        torch.autograd.backward([p for p, _ in pairs], [g for _, g in pairs])


def _accumulate(acc, grads):
    for i, g in enumerate(grads):
        if g is None:
            continue
        acc[i] = g if acc[i] is None else acc[i] + g


class TiledMLP(torch.autograd.Function):
    """``TiledMLP.apply(fn, self, x, num_shards, compute_params)`` computes ``fn(self, x)`` over
    ``num_shards`` slices of ``x`` along dim 1 (``x`` is ``[batch, seq, hidden]``) and
    concatenates the results; backward recomputes one slice at a time.

    ``fn`` must be token-local along dim 1 (an MLP is). ``num_shards=None`` applies
    :func:`tiled_mlp_num_shards` with ``hidden = x.shape[-1]``.
    """

    @classmethod
    def apply(cls, fn, self, x, num_shards, compute_params=None):
        if num_shards is None:
            num_shards = tiled_mlp_num_shards(x.shape[1], x.shape[-1])
        _check_shards(num_shards, "TiledMLP")
        params = _trainable_params(self, compute_params)
        return super().apply(fn, self, x, num_shards, params)

    @staticmethod
    def forward(ctx, fn, self, x, num_shards, params):
        ctx.fn, ctx.module, ctx.num_shards, ctx.params = fn, self, num_shards, params
        ctx.save_for_backward(x)
        with torch.no_grad():
            outs = [fn(self, shard) for shard in _split(x, num_shards, 1)]
        return torch.cat(outs, dim=1)

    @staticmethod
    def backward(ctx, grad_out):
        x, = ctx.saved_tensors
        params = ctx.params
        x_grad = torch.zeros_like(x) if ctx.needs_input_grad[2] else None
        acc = [None] * len(params)
        offset = 0
        grad_shards = _split(grad_out, ctx.num_shards, 1)
        for shard, g in zip(_split(x, ctx.num_shards, 1), grad_shards):
            n = shard.shape[1]
            shard = shard.detach().requires_grad_(x_grad is not None)
            with torch.enable_grad():
                out = ctx.fn(ctx.module, shard)
            _shard_backward(out, g, shard if x_grad is not None else None, params, x_grad,
                            offset, acc)
            del out
            offset += n
        _deliver(params, acc)
        return None, None, x_grad, None, None


_REDUCTIONS = (None, "mean", "sum")


class SequenceTiledCompute(torch.autograd.Function):
    """Generic sequence tiling of ``fn(**kwargs)``: the tensors in ``kwargs_to_shard`` are split
    into ``shards`` pieces along dim 1, ``fn`` runs once per piece (with ``kwargs_to_pass``
    unsplit) and the outputs are concatenated along ``output_unshard_dimension``
    (``output_reduction=None``) or reduced over the shards (``"mean"`` / ``"sum"``, for a loss).
    Only ``kwargs_to_shard[grad_requiring_tensor_key]`` gets an input gradient (the others are
    treated as constants, like labels), plus the parameters.

    Use it through :func:`sequence_tiled_compute`. ``"mean"`` is the plain mean of the shard
    outputs; when shards hold different numbers of counted tokens (uneven split, masked labels)
    return a sum from ``fn``, use ``"sum"`` and divide by the token count yourself.
    """

    @staticmethod
    def forward(ctx, fn, seqlen, shards, keys_to_shard, keys_to_pass, grad_requiring_tensor_key,
                params, output_unshard_dimension, output_reduction, *args):
        n_shard, n_pass = len(keys_to_shard), len(keys_to_pass)
        to_shard = dict(zip(keys_to_shard, args[:n_shard]))
        to_pass = dict(zip(keys_to_pass, args[n_shard:n_shard + n_pass]))
        ctx.fn, ctx.shards, ctx.params = fn, shards, params
        ctx.keys_to_shard, ctx.keys_to_pass = keys_to_shard, keys_to_pass
        ctx.grad_key = grad_requiring_tensor_key
        ctx.grad_index = 9 + keys_to_shard.index(grad_requiring_tensor_key)
        ctx.dim, ctx.reduction = output_unshard_dimension, output_reduction
        ctx.to_pass = to_pass  # non-tensor or constant arguments
        ctx.save_for_backward(*args[:n_shard])
        with torch.no_grad():
            outs = [fn(**piece, **to_pass) for piece in _pieces(to_shard, shards)]
        if output_reduction is None:
            return torch.cat(outs, dim=output_unshard_dimension)
        total = torch.stack([o.reshape(()) if o.dim() else o for o in outs]).sum(0)
        return total / shards if output_reduction == "mean" else total

    @staticmethod
    def backward(ctx, grad_out):
        saved = ctx.saved_tensors
        n_shard = len(ctx.keys_to_shard)
        to_shard = dict(zip(ctx.keys_to_shard, saved[:n_shard]))
        params = ctx.params
        x = to_shard[ctx.grad_key]
        want_x = ctx.needs_input_grad[ctx.grad_index]
        x_grad = torch.zeros_like(x) if want_x else None
        acc = [None] * len(params)
        if ctx.reduction is None:
            grad_pieces = _split(grad_out, ctx.shards, ctx.dim)
        else:
            g = grad_out / ctx.shards if ctx.reduction == "mean" else grad_out
            grad_pieces = [g] * ctx.shards
        offset = 0
        for piece, g in zip(_pieces(to_shard, ctx.shards), grad_pieces):
            shard = piece[ctx.grad_key].detach().requires_grad_(want_x)
            piece[ctx.grad_key] = shard
            n = shard.shape[1]
            with torch.enable_grad():
                out = ctx.fn(**piece, **ctx.to_pass)
            _shard_backward(out, g.reshape(out.shape), shard if want_x else None, params,
                            x_grad, offset, acc)
            del out
            offset += n
        grads_in = [None] * n_shard
        if want_x:
            grads_in[ctx.keys_to_shard.index(ctx.grad_key)] = x_grad
        _deliver(params, acc)
        return (None,) * 9 + tuple(grads_in) + (None,) * len(ctx.keys_to_pass)


def _shard_backward(out, grad, shard, params, x_grad, offset, acc):
    """Backpropagate ``grad`` through one recomputed shard's ``out``: the gradient of ``shard``
    (None when the input needs none) lands in ``x_grad`` at ``offset`` along dim 1, and the
    parameters' gradients are summed into ``acc`` (delivered once, after the last shard)."""
    inputs = ([shard] if shard is not None else []) + params
    if not inputs or not out.requires_grad:
        return
    grads = torch.autograd.grad(out, inputs, grad, allow_unused=True)
    if shard is not None:
        if grads[0] is not None:
            x_grad.narrow(1, offset, shard.shape[1]).copy_(grads[0])
        grads = grads[1:]
    _accumulate(acc, grads)


def _pieces(to_shard, shards):
    split = {k: _split(v, shards, 1) for k, v in to_shard.items()}
    return [{k: split[k][i] for k in split} for i in range(shards)]


def sequence_tiled_compute(fn, seqlen, shards, kwargs_to_shard, kwargs_to_pass,
                           grad_requiring_tensor_key, compute_params=None,
                           output_unshard_dimension=1, output_reduction="mean"):
    """Run ``fn(**kwargs_to_shard_piece, **kwargs_to_pass)`` over ``shards`` sequence shards
    (dim 1 of every tensor in ``kwargs_to_shard``), recomputing each shard in backward; see
    :class:`SequenceTiledCompute`. ``seqlen`` must equal dim 1 of the sharded tensors."""
    _check_shards(shards, "sequence_tiled_compute")
    if output_reduction not in _REDUCTIONS:
        raise ValueError(f"sequence_tiled_compute: output_reduction must be one of {_REDUCTIONS}, "
                         f"got {output_reduction!r}")
    if grad_requiring_tensor_key not in kwargs_to_shard:
        raise ValueError(f"sequence_tiled_compute: grad_requiring_tensor_key "
                         f"{grad_requiring_tensor_key!r} is not one of kwargs_to_shard "
                         f"{list(kwargs_to_shard)}")
    for key, value in kwargs_to_shard.items():
        if not isinstance(value, torch.Tensor) or value.dim() < 2 or value.shape[1] != seqlen:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"sequence_tiled_compute: kwargs_to_shard[{key!r}] must be a tensor "
                             f"with dim 1 of size seqlen={seqlen}, got {shape}")
    keys_to_shard, keys_to_pass = list(kwargs_to_shard), list(kwargs_to_pass or {})
    owner = getattr(fn, "__self__", None)
    params = _trainable_params(owner, compute_params)
    return SequenceTiledCompute.apply(fn, seqlen, shards, keys_to_shard, keys_to_pass,
                                      grad_requiring_tensor_key, params, output_unshard_dimension,
                                      output_reduction, *kwargs_to_shard.values(),
                                      *(kwargs_to_pass or {}).values())


class TiledFusedLogitsLoss(torch.autograd.Function):
    """``TiledFusedLogitsLoss.apply(fn, self, x, y, mask, shards, compute_params,
    output_reduction)``: ``fn(self, x_shard, y_shard[, mask_shard])`` computes the loss of one
    sequence shard (typically ``lm_head`` + cross-entropy), so the full ``[batch, seq, vocab]``
    logits tensor never exists; only one shard's logits are live, in forward and in backward.

    ``x`` (hidden states), ``y`` (labels, already shifted: use ``shift_labels`` with -100 at the
    end, since shifting inside a shard would lose the label at the shard boundary) and ``mask``
    (``None``: not passed to ``fn``) are split along dim 1. ``output_reduction`` ``"mean"``
    averages the shard losses (exact only when every shard has the same number of counted
    tokens); ``"sum"`` adds them: have ``fn`` return a summed loss (``reduction="sum"``,
    ``ignore_index=-100``) and divide by the number of non-ignored labels.

    Deviation from upstream, which runs backward inside forward (assuming a unit incoming
    gradient): this recomputes each shard in backward instead, so any incoming gradient (loss
    scaling, gradient-accumulation division) is honoured.
    """

    @classmethod
    def apply(cls, fn, self, x, y, mask, shards, compute_params=None, output_reduction="mean"):
        _check_shards(shards, "TiledFusedLogitsLoss")
        if output_reduction not in ("mean", "sum"):
            raise ValueError(f"TiledFusedLogitsLoss: output_reduction must be 'mean' or 'sum', "
                             f"got {output_reduction!r}")
        if y.shape[:2] != x.shape[:2]:
            raise ValueError(f"TiledFusedLogitsLoss: x {tuple(x.shape)} and y {tuple(y.shape)} "
                             f"must agree on [batch, seq]")
        params = _trainable_params(self, compute_params)
        return super().apply(fn, self, x, y, mask, shards, output_reduction, params)

    @staticmethod
    def forward(ctx, fn, self, x, y, mask, shards, output_reduction, params):
        ctx.fn, ctx.module, ctx.shards, ctx.reduction = fn, self, shards, output_reduction
        ctx.has_mask, ctx.params = mask is not None, params
        ctx.save_for_backward(x, y, *([mask] if mask is not None else []))
        with torch.no_grad():
            losses = [fn(self, *piece) for piece in _loss_pieces(x, y, mask, shards)]
        total = torch.stack([l.reshape(()) for l in losses]).sum()
        return total / shards if output_reduction == "mean" else total

    @staticmethod
    def backward(ctx, grad_out):
        saved = ctx.saved_tensors
        x, y = saved[0], saved[1]
        mask = saved[2] if ctx.has_mask else None
        params = ctx.params
        want_x = ctx.needs_input_grad[2]
        x_grad = torch.zeros_like(x) if want_x else None
        acc = [None] * len(params)
        g = grad_out / ctx.shards if ctx.reduction == "mean" else grad_out
        offset = 0
        for piece in _loss_pieces(x, y, mask, ctx.shards):
            shard = piece[0].detach().requires_grad_(want_x)
            n = shard.shape[1]
            with torch.enable_grad():
                loss = ctx.fn(ctx.module, shard, *piece[1:])
            _shard_backward(loss, g.reshape(loss.shape), shard if want_x else None, params,
                            x_grad, offset, acc)
            del loss
            offset += n
        _deliver(params, acc)
        return None, None, x_grad, None, None, None, None, None


def _loss_pieces(x, y, mask, shards):
    xs, ys = _split(x, shards, 1), _split(y, shards, 1)
    ms = _split(mask, shards, 1) if mask is not None else [None] * shards
    return [(a, b) if m is None else (a, b, m) for a, b, m in zip(xs, ys, ms)]
