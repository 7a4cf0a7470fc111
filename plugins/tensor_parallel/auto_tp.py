"""Automatic tensor parallelism (AutoTP), for inference and as the first step of tensor-parallel
training (``tp_model_init``): find, in each transformer block, the
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
A column-parallel Linear marked ``FUSED_BLOCKS`` (``deepspeed.tensor_parallel.sharding``: a fused
``[q; k; v]`` over all heads) gives each rank its heads' rows of every block.
"""
import torch
from torch import nn

from deepspeed.tensor_parallel.layers import LinearAllreduce, LinearLayer
from deepspeed.tensor_parallel.sharding import (FUSED_BLOCKS, fused_narrow_fn, mark, narrow_fn,
                                                take_shard)

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


def _moe_prefixes(module):
    """Names (with a trailing dot) of the MoE layers (modules with ``deepspeed_moe``) inside
    ``module``: AutoTP leaves their insides alone."""
    return [n + "." for n, m in module.named_modules() if n and hasattr(m, "deepspeed_moe")]


def _linears(module):
    """The Linears of ``module`` AutoTP may split: not those inside a MoE layer, whose gate
    scores every expert and whose experts are split by expert (``deepspeed.inference``'s
    ``moe_inference``)."""
    moe = _moe_prefixes(module)
    return [(name, m) for name, m in module.named_modules()
            if isinstance(m, nn.Linear) and not any(name.startswith(p) for p in moe)]


class AutoTP:
    """Policy detection and sharding (upstream's ``deepspeed.module_inject.auto_tp.AutoTP``)."""

    @staticmethod
    def block_classes(model):
        """Classes of the modules stacked in ``nn.ModuleList``s (outermost lists first; the
        inside of a found block is not searched again)."""
        found, skip = [], _moe_prefixes(model)
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
            # every instance: T5's decoder blocks hold a cross-attention its encoder blocks lack
            blocks = [m for m in model.modules() if type(m) is cls]
            rows = tuple(dict.fromkeys(name for b in blocks for name, _ in _linears(b)
                                       if _is_row_parallel(name)))
            block = blocks[0]
            if not rows:
                raise TensorParallelError(
                    f"AutoTP found no Linear writing into the residual stream in "
                    f"{cls.__name__} (Linears: {[n for n, _ in _linears(block)]}); name them "
                    f"with injection_policy={{{cls.__name__}: ('<attention output>', "
                    f"'<mlp output>')}}")
            policy.append((cls, rows))
        if not policy and _moe_prefixes(model):
            return policy  # only MoE layers: their experts are sliced by expert (moe_inference)
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
                f"block (e.g. ('self_attn.o_proj', 'mlp.down_proj')), or for init_inference a "
                f"policy class of deepspeed.inference (HFBertLayerPolicy), got {names!r}")
        policy.append((cls, tuple(names)))
    return policy


def _matches(name, names):
    return any(name == n or name.endswith("." + n) for n in names)


def _sliced(tensor, dim, rank, tp_size):
    """``rank``'s slice along ``dim`` (uneven when ``tp_size`` does not divide it) and the
    function that cuts it, kept on the new parameter for checkpoint loading."""
    take = narrow_fn(dim, tp_size, rank)
    return take_shard(tensor, take), take


def _head_embeddings(block):
    """``(owner, name, embedding)`` for each ``nn.Embedding`` with one column per head of the
    attention module holding it (T5's ``relative_attention_bias``)."""
    found = []
    for sub in block.modules():
        heads = [getattr(sub, a) for a in ("n_heads", "num_heads", "num_attention_heads")
                 if isinstance(getattr(sub, a, None), int)]
        for name, child in sub.named_children():
            if type(child) is nn.Embedding and heads and child.embedding_dim == heads[0]:
                found.append((sub, name, child))
    return found


def _check_divisible(what, value, tp_size, where):
    if value % tp_size:
        raise TensorParallelError(
            f"tp_size={tp_size} does not divide {what}={value} of {where}; choose a tp_size that "
            f"divides it (every rank must hold whole heads and equal slices)")


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
    # a Linear size tp_size does not divide (an MLP width) is split unevenly: the head counts
    # checked above keep the attention projections even
    for owner, attr, emb in _head_embeddings(block):  # per-head bias tables: split by heads
        weight, take = _sliced(emb.weight.data, 1, rank, tp_size)
        new = nn.Embedding(emb.num_embeddings, weight.shape[1], _weight=weight, _freeze=True)
        mark(new.weight, take)
        setattr(owner, attr, new)
    for name, linear in linears:
        weight, bias = linear.weight.data, linear.bias
        if _matches(name, row_names):
            shard, take = _sliced(weight, 1, rank, tp_size)
            new = LinearAllreduce(shard, None if bias is None else bias.data.clone().detach(),
                                  group)
            mark(new.weight, take)
        else:
            blocks = getattr(linear, FUSED_BLOCKS, None)
            take = narrow_fn(0, tp_size, rank) if blocks is None else \
                fused_narrow_fn(0, blocks, tp_size, rank)
            shard = take_shard(weight, take)
            new = LinearLayer(weight=shard, bias=None if bias is None else
                              take_shard(bias.data, take))
            mark(new.weight, take)
            if new.bias is not None:
                mark(new.bias, take)
            if blocks is not None:  # still fused: a split checkpoint records it
                setattr(new, FUSED_BLOCKS, blocks)
        block.set_submodule(name, new)
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
