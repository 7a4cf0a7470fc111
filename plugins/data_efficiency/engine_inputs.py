"""What the plugin changes in a training forward's inputs: the legacy seqlen curriculum (the
``curriculum_seqlen`` keyword, or truncation of the batch when the model does not take it) and
progressive layer drop's ``progressive_layer_drop=True, pld_theta=θ`` keywords."""
import inspect

from deepspeed.utils.lazy_module import lazy_module

torch = lazy_module("torch")  # loaded on first use (the launcher imports this plugin without torch)


def accepts_keyword(module, name):
    """Whether ``module.forward`` takes keyword ``name`` (by name or through ``**kwargs``)."""
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: assume it does
        return True
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def truncate(value, seqlen, seq_dim=1):
    """Tensors (nested in lists/tuples/dicts) with a sequence axis longer than ``seqlen``
    cut to their first ``seqlen`` positions along it."""
    if torch.is_tensor(value):
        if value.dim() > seq_dim and value.size(seq_dim) > seqlen:
            return value.narrow(seq_dim, 0, seqlen)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(truncate(v, seqlen, seq_dim) for v in value)
    if isinstance(value, dict):
        return {k: truncate(v, seqlen, seq_dim) for k, v in value.items()}
    return value
