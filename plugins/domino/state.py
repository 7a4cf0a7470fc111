"""Moving whole (unsplit) weights into a Domino model: each tensor-parallel parameter carries
the tensor-parallel plugin's marks (``tensor_model_parallel``, ``partition_dim``), so this
rank's slice of a full tensor is its ``partition_dim`` chunk; everything else is copied."""
import torch

from deepspeed import comm as dist
from deepspeed.tensor_parallel import PARTITION_DIM, TENSOR_MODEL_PARALLEL


def load_unsplit_state_dict(module, state_dict):
    """Copy ``state_dict`` (the unsplit model's tensors, keyed like ``module``'s) into
    ``module``, keeping this rank's slice of every tensor-parallel parameter. Every key of
    ``module`` must be present, with the full shape."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name not in state_dict:
                raise KeyError(f"load_unsplit_state_dict: {name!r} missing from the state dict")
            full = state_dict[name]
            if getattr(param, TENSOR_MODEL_PARALLEL, False):
                group = getattr(_owner(module, name), "group", None)
                dim = getattr(param, PARTITION_DIM)
                size, rank = dist.get_world_size(group=group), dist.get_rank(group=group)
                full = full.chunk(size, dim)[rank]
            if full.shape != param.shape:
                raise ValueError(f"load_unsplit_state_dict: {name!r} has shape "
                                 f"{tuple(state_dict[name].shape)}, expected the unsplit shape "
                                 f"of this rank's {tuple(param.shape)}")
            param.copy_(full)
    return module


def _owner(module, name):
    for part in name.split(".")[:-1]:
        module = getattr(module, part)
    return module
