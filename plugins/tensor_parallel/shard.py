"""``deepspeed.tp_model_init``: split a model for tensor-parallel training.

The split itself is AutoTP (``deepspeed.tensor_parallel.auto_tp``: which Linears of each
transformer block write into the residual stream, how to cut weights and head counts, the
errors for heads that do not divide); this module builds the tensor x data parallel groups
(``deepspeed.tensor_parallel.groups.init_tensor_parallel_groups``), runs that split, and
swaps the inference layers for the training ones of ``deepspeed.tensor_parallel.layers``
(autograd through the all-reduces), whose weights are the *original* Parameter objects now
holding their slices: ``model.parameters()`` taken before the split (and ``requires_grad``)
stay valid. Then it marks the parameters every rank
of the tensor-parallel group holds whole: on all but its first rank they carry
``deepspeed.hooks.REPLICATED_PARAM``, so the global gradient norm counts them once.

The split model remembers its groups (``split_of(model)``): ``deepspeed.initialize`` takes
them from there, so a model split by ``tp_model_init`` needs no ``mpu`` argument.
"""
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from torch import nn

from deepspeed import comm as dist
from deepspeed.accelerator import get_accelerator
from deepspeed.hooks import REPLICATED_PARAM
from deepspeed.tensor_parallel.auto_tp import AutoTP, policy_from_injection, shard_model
from deepspeed.tensor_parallel.config import SECTION, TensorParallelTrainingConfig
from deepspeed.tensor_parallel.groups import init_tensor_parallel_groups
from deepspeed.tensor_parallel.layers import (TENSOR_MODEL_PARALLEL, ColumnParallelLinear,
                                              SharedInputCopy, from_inference_layer)

_SPLIT_ATTRIBUTE = "ds_tensor_parallel_split"


@dataclass(frozen=True)
class TensorParallelSplit:
    """What ``tp_model_init`` did to a model: its groups (a
    ``deepspeed.tensor_parallel.groups.TensorParallelGroups``) and the AutoTP policy it applied."""

    groups: Any
    policy: Tuple

    @property
    def tp_size(self):
        return self.groups.tp_size


def split_of(model) -> Optional[TensorParallelSplit]:
    """The split ``tp_model_init`` applied to ``model``, or None."""
    return getattr(model, _SPLIT_ATTRIBUTE, None)


def section_of(config) -> Optional[TensorParallelTrainingConfig]:
    """The validated ``tensor_parallel`` section of a training config given as a dict, a JSON
    path or None (other keys, "auto" values included, are not looked at here)."""
    if config is None:
        return None
    if not isinstance(config, dict):
        from deepspeed.config.loader import load_config_source

        config = load_config_source(config)
    raw = config.get(SECTION)
    if raw is None:
        return None
    from deepspeed.config.errors import DeepSpeedConfigError

    try:
        return TensorParallelTrainingConfig(**raw)
    except Exception as exc:  # the pydantic message, with the section named
        raise DeepSpeedConfigError(f"'{SECTION}' section: {exc}") from exc


def tp_model_init(model, tp_size, dtype, config=None, **kwargs):
    """Split ``model`` over ``tp_size`` ranks (collective: every rank calls it) after casting
    its floating-point weights to ``dtype`` (None keeps them); returns ``model``, changed in
    place. ``config`` (the training config) may name ``tensor_parallel.autotp_size``, which
    must then equal ``tp_size``, and ``tensor_parallel.injection_policy_tuple``."""
    if kwargs:
        raise TypeError(f"tp_model_init got unexpected keyword arguments {sorted(kwargs)}; it "
                        f"takes model, tp_size, dtype and config")
    if not isinstance(model, nn.Module):
        raise TypeError(f"tp_model_init needs a torch.nn.Module, got {type(model).__name__}")
    section = section_of(config)
    if section is not None and section.autotp_size > 1 and section.autotp_size != tp_size:
        raise ValueError(f"tp_model_init(tp_size={tp_size}) disagrees with the config's "
                         f"tensor_parallel.autotp_size={section.autotp_size}; use one size")
    done = split_of(model)
    if done is not None:
        if done.tp_size != tp_size:
            raise ValueError(f"the model is already split over tp_size={done.tp_size}; "
                             f"tp_model_init(tp_size={tp_size}) cannot split it again")
        return model
    if not dist.is_initialized():
        dist.init_distributed(verbose=False)
    unit = init_tensor_parallel_groups(tp_size)
    if dtype is not None:
        model.to(dtype)  # floating-point tensors only
    if section is None:
        section = TensorParallelTrainingConfig()
    split_model(model, unit, section.injection_policy_tuple,
                shard_device=shard_device(section, get_accelerator().current_device_name()),
                overlap_comm=section.tp_overlap_comm)
    return model


def shard_device(section, device):
    """Where each split Linear's slices go as they are cut: ``device`` (the accelerator's),
    so a model loaded on the host never has its unsplit weights on the device and the device
    only ever holds this rank's shards; None (stay where the model sits) with
    ``tensor_parallel.keep_module_on_host``, which leaves moving the split model to the user
    or ``deepspeed.initialize`` (to quantise or inspect the shards on the host first)."""
    return None if section.keep_module_on_host else device


def set_overlap_comm(model, overlap_comm):
    """``tensor_parallel.tp_overlap_comm``: whether the column-parallel Linears of ``model``
    overlap their input gradient's all-reduce with the weight gradient in backward."""
    for module in model.modules():
        if isinstance(module, ColumnParallelLinear):
            module.overlap_comm = bool(overlap_comm)


def split_model(model, unit, row_parallel_names=None, *, shard_device=None, overlap_comm=False):
    """Split ``model`` in place over ``unit``'s tensor-parallel group (see the module
    docstring); ``row_parallel_names`` overrides AutoTP's choice of the Linears that write
    into the residual stream, for every block class it finds. Each split Linear moves to
    ``shard_device`` (None: stays) once cut; ``overlap_comm``: see ``set_overlap_comm``."""
    if row_parallel_names:
        policy = policy_from_injection({cls: tuple(row_parallel_names)
                                        for cls in AutoTP.block_classes(model)})
    else:
        policy = AutoTP.tp_parser(model)
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    group = unit.get_tensor_model_parallel_group()
    shard_model(model, policy, unit.tp_size, unit.tp_rank, group)
    shared_copy = SharedInputCopy()
    for name, module in list(model.named_modules()):
        replacement = from_inference_layer(module, group, linears.get(name), shared_copy)
        if replacement is not None:
            if shard_device is not None:  # its Parameters stay the same objects
                replacement.to(shard_device)
            model.set_submodule(name, replacement)
    set_overlap_comm(model, overlap_comm)
    _check_still_trainable(model, trainable)
    if unit.tp_rank != 0:
        for param in model.parameters():
            if not getattr(param, TENSOR_MODEL_PARALLEL, False):
                setattr(param, REPLICATED_PARAM, True)
    setattr(model, _SPLIT_ATTRIBUTE, TensorParallelSplit(unit, tuple(policy)))
    return model


def _check_still_trainable(model, trainable):
    """Every parameter that trained before the split still does: a module AutoTP split into a
    layer with no training counterpart here (frozen inference weights, no autograd through
    its communication) would otherwise train silently wrong."""
    now = dict(model.named_parameters())
    lost = sorted(name for name in trainable if name not in now or not now[name].requires_grad)
    if lost:
        owners = sorted({type(model.get_submodule(n.rpartition(".")[0])).__name__
                         for n in lost if n in now})
        raise NotImplementedError(
            f"AutoTP split {len(lost)} trainable parameter(s) into layers tensor-parallel "
            f"training has no counterpart for ({', '.join(owners) or 'removed'}; e.g. "
            f"{lost[:3]}); only Linear layers inside transformer blocks are split for training")
