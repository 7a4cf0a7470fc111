"""How data-parallel gradients are averaged: the dtype they travel in and where the 1/N goes.

Shared by the core's all-reduce and by plugins that reduce gradients themselves (ZeRO's
reduce-scatter), so ``communication_data_type``, ``prescale_gradients`` and
``gradient_predivide_factor`` mean the same thing whichever collective carries the gradients.
Sparse gradients (``sparse_gradients``) are averaged here too, before the dense flat buffer.
"""
import torch

COMM_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
               "bfp16": torch.bfloat16}


def communication_dtype(config, grad_dtype):
    """``communication_data_type`` when set, else the gradients' own dtype."""
    return COMM_DTYPES.get(config.communication_data_type, grad_dtype)


def scale_before_reduce(flat, config):
    """Pre-divide (in place) when ``prescale_gradients`` is on, to keep fp16 sums in range."""
    if config.prescale_gradients:
        flat.div_(config.gradient_predivide_factor)
    return flat


def scale_after_reduce(flat, config, world_size):
    """Finish the average (in place): the reduced sum times whatever of 1/N is left."""
    predivide = config.gradient_predivide_factor if config.prescale_gradients else 1.0
    flat.mul_(predivide / world_size)
    return flat


def reduce_sparse_gradients(grads, config, group, world_size):
    """Average the sparse gradients among ``grads`` (``nn.Embedding(sparse=True)``) over the
    group, in place, and return the dense ones, which the caller reduces in one flat buffer.

    With ``sparse_gradients`` a sparse gradient travels as what it is: every rank's row indices
    and rows are all-gathered and summed (rows several ranks touched are added up), so the traffic
    is the rows touched, not the whole table. Without it, it is made dense and all-reduced whole.
    """
    dense = [grad for grad in grads if not grad.is_sparse]
    if world_size == 1 or len(dense) == len(grads):
        return dense
    from deepspeed import comm as dist

    for grad in grads:
        if not grad.is_sparse:
            continue
        if config.sparse_gradients_enabled:
            reduced = _all_gather_sparse(grad, config, group, world_size, dist)
        else:
            whole = grad.to_dense().to(communication_dtype(config, grad.dtype))
            scale_before_reduce(whole, config)
            dist.all_reduce(whole, group=group)
            reduced = scale_after_reduce(whole, config, world_size).to(grad.dtype).to_sparse(
                grad.sparse_dim())
        grad.copy_(reduced)
    return dense


def _all_gather_sparse(grad, config, group, world_size, dist):
    """The group's average of one sparse COO gradient, gathered as indices and values."""
    grad = grad.coalesce()
    indices = grad.indices()
    values = grad.values().to(communication_dtype(config, grad.dtype), copy=True)
    scale_before_reduce(values, config)
    counts = [torch.zeros(1, dtype=torch.long, device=grad.device) for _ in range(world_size)]
    dist.all_gather(counts, torch.tensor([values.shape[0]], device=grad.device), group=group)
    counts = [int(count) for count in counts]
    longest = max(counts)
    # all_gather needs equal shapes: pad every rank's entries to the longest, trim after
    padded_indices = indices.new_zeros((indices.shape[0], longest))
    padded_indices[:, :indices.shape[1]] = indices
    padded_values = values.new_zeros((longest,) + tuple(values.shape[1:]))
    padded_values[:values.shape[0]] = values
    all_indices = [torch.empty_like(padded_indices) for _ in range(world_size)]
    all_values = [torch.empty_like(padded_values) for _ in range(world_size)]
    dist.all_gather(all_indices, padded_indices, group=group)
    dist.all_gather(all_values, padded_values, group=group)
    summed = torch.sparse_coo_tensor(
        torch.cat([i[:, :n] for i, n in zip(all_indices, counts)], dim=1),
        torch.cat([v[:n] for v, n in zip(all_values, counts)]), grad.shape).coalesce()
    averaged = scale_after_reduce(summed.values(), config, world_size)
    return torch.sparse_coo_tensor(summed.indices(), averaged.to(grad.dtype), grad.shape)
