"""Automatic tensor parallelism (AutoTP) for inference: find, in each transformer block, the
Linear layers that write into the residual stream, split them by rows with an all-reduce
(``LinearAllreduce``) and split every other Linear of the block by columns (``LinearLayer``);
then divide the head counts the attention modules keep, so their reshapes see this rank's heads.

``AutoTP.tp_parser(model)`` returns the policy it detected, ``[(block class, (names of the
row-parallel Linears inside the block, ...))]``, exactly what a user writes by hand as
``injection_policy={Block: ('o_proj', 'down_proj')}``; both go through ``shard_model``.

A transformer block is a class whose instances fill an ``nn.ModuleList`` (the layer stack).
A Linear writes into the residual stream when its name says so: ``o_proj``, ``out_proj``,
``down_proj``, ``fc2``, ``wo``, ``o``, ``dense_4h_to_h``, ``w2``, or a ``dense`` under an
``output`` / ``attention`` module (BERT's ``attention.output.dense`` and ``output.dense``).
A block without one has no known policy: the error names ``injection_policy``.
"""
import torch
from torch import nn

from deepspeed.inference.layers import LinearAllreduce, LinearLayer

ROW_PARALLEL_NAMES = ("o_proj", "out_proj", "down_proj", "fc2", "wo", "o", "dense_4h_to_h", "w2")
ROW_PARALLEL_DENSE_PARENTS = ("output", "attention", "self_attention", "attn", "self_attn")
# per-module head counts that a column split divides by tp_size
HEAD_ATTRIBUTES = ("num_heads", "num_attention_heads", "num_key_value_heads", "num_kv_heads",
                   "n_heads", "n_kv_heads", "all_head_size", "inner_dim")
# head counts read from a module's ``config`` (Llama/Mistral attention keeps none of its own)
CONFIG_HEAD_ATTRIBUTES = ("num_attention_heads", "num_key_value_heads")


class TensorParallelError(ValueError):
    """A model that cannot be split as asked; the message says what and how to fix it."""


def _is_row_parallel(name):
    parts = name.split(".")
    if parts[-1] in ROW_PARALLEL_NAMES:
        return True
    return parts[-1] == "dense" and len(parts) > 1 and parts[-2] in ROW_PARALLEL_DENSE_PARENTS


def _linears(module):
    return [(name, m) for name, m in module.named_modules() if isinstance(m, nn.Linear)]


class AutoTP:
    """Policy detection and sharding (upstream's ``deepspeed.module_inject.auto_tp.AutoTP``)."""

    @staticmethod
    def block_classes(model):
        """Classes of the modules stacked in ``nn.ModuleList``s (outermost lists first; the
        inside of a found block is not searched again)."""
        found, skip = [], []
        for name, module in model.named_modules():
            if any(name.startswith(prefix) for prefix in skip):
                continue
            if isinstance(module, nn.ModuleList) and len(module) > 0:
                classes = {type(child) for child in module}
                if len(classes) == 1 and _linears(module[0]):
                    cls = classes.pop()
                    if cls not in found:
                        found.append(cls)
                    skip.append(name + ".")
        return found

    @staticmethod
    def tp_parser(model):
        """``[(block class, (row-parallel Linear names, ...))]`` for ``model``; raises
        ``TensorParallelError`` naming ``injection_policy`` when no policy is found."""
        policy = []
        classes = AutoTP.block_classes(model)
        for cls in classes:
            block = next(m for m in model.modules() if type(m) is cls)
            rows = tuple(name for name, _ in _linears(block) if _is_row_parallel(name))
            if not rows:
                raise TensorParallelError(
                    f"AutoTP found no Linear writing into the residual stream in "
                    f"{cls.__name__} (Linears: {[n for n, _ in _linears(block)]}); name them "
                    f"with injection_policy={{{cls.__name__}: ('<attention output>', "
                    f"'<mlp output>')}}")
            policy.append((cls, rows))
        if not policy:
            raise TensorParallelError(
                f"AutoTP found no transformer layers in {type(model).__name__} (no nn.ModuleList "
                f"of blocks holding Linear layers), so it has no policy to split it; pass "
                f"injection_policy={{BlockClass: ('attention_out_linear', 'mlp_out_linear')}}")
        return policy


def policy_from_injection(injection_policy):
    """``injection_policy`` (``{Block: ('o_proj', 'down_proj')}``) as a ``tp_parser`` list."""
    policy = []
    for cls, names in injection_policy.items():
        if not isinstance(cls, type):
            raise TensorParallelError(f"injection_policy keys are module classes, got {cls!r}")
        if isinstance(names, str):
            names = (names,)
        if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
            raise TensorParallelError(
                f"injection_policy[{cls.__name__}] must be a tuple of Linear names inside the "
                f"block (e.g. ('self_attn.o_proj', 'mlp.down_proj')); kernel-injection policy "
                f"classes need replace_with_kernel_inject, which runs only on GPU kernels")
        policy.append((cls, tuple(names)))
    return policy


def _matches(name, names):
    return any(name == n or name.endswith("." + n) for n in names)


def _slice(tensor, dim, rank, tp_size):
    size = tensor.shape[dim] // tp_size
    return tensor.narrow(dim, rank * size, size).clone().detach()


def _check_divisible(what, value, tp_size, where):
    if value % tp_size:
        raise TensorParallelError(
            f"tp_size={tp_size} does not divide {what}={value} of {where}; choose a tp_size that "
            f"divides it (every rank must hold whole heads and equal slices)")


def _set(root, name, new):
    parent_name, _, leaf = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, leaf, new)


def shard_block(block, row_names, tp_size, rank, group, where="block"):
    """Split ``block``'s Linears in place: the ones ``row_names`` match become
    ``LinearAllreduce``, the others ``LinearLayer``; divide the head counts."""
    linears = _linears(block)
    if not any(_matches(name, row_names) for name, _ in linears):
        raise TensorParallelError(
            f"injection_policy names {row_names} but {where} ({type(block).__name__}) has no "
            f"such Linear; its Linears are {[n for n, _ in linears]}")
    # check everything before changing anything
    for name, sub in block.named_modules():
        for attr in HEAD_ATTRIBUTES:
            value = getattr(sub, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                _check_divisible(attr, value, tp_size, f"{where}.{name}".rstrip("."))
        config = getattr(sub, "config", None)
        for attr in CONFIG_HEAD_ATTRIBUTES:
            value = getattr(config, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                _check_divisible(attr, value, tp_size, f"{where}.{name} config".replace(". ", " "))
    for name, linear in linears:
        row = _matches(name, row_names)
        dim = linear.in_features if row else linear.out_features
        _check_divisible("in_features" if row else "out_features", dim, tp_size, f"{where}.{name}")
    for name, linear in linears:
        weight, bias = linear.weight.data, linear.bias
        if _matches(name, row_names):
            new = LinearAllreduce(_slice(weight, 1, rank, tp_size),
                                  None if bias is None else bias.data.clone().detach(), group)
        else:
            new = LinearLayer(weight=_slice(weight, 0, rank, tp_size),
                              bias=None if bias is None else _slice(bias.data, 0, rank, tp_size))
        _set(block, name, new)
    for sub in block.modules():
        for attr in HEAD_ATTRIBUTES:
            value = getattr(sub, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(sub, attr, value // tp_size)


def shard_model(model, policy, tp_size, rank, group):
    """Apply ``policy`` (``[(block class, row names)]``) to every block of ``model``; returns
    the number of blocks split."""
    count = 0
    for cls, row_names in policy:
        blocks = [(name, m) for name, m in model.named_modules() if type(m) is cls]
        if not blocks:
            raise TensorParallelError(f"injection_policy names {cls.__name__}, which "
                                      f"{type(model).__name__} does not contain")
        for name, block in blocks:
            shard_block(block, row_names, tp_size, rank, group, where=name or "<model>")
            count += 1
    return count
