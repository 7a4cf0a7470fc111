"""``load_checkpoint``: put a saved engine state back, on every rank.

The file read is ``mp_rank_<model-parallel rank>_model_states.pt`` unless a plugin names
another (``deepspeed_model_states_file``: a pipeline loaded with more stages than it was saved
with). Order: module weights (a plugin may load them from its own files through
``deepspeed_load_module_state``), then (unless ``load_module_only``) optimizer, LR scheduler,
counters, this rank's RNG and the plugins' ``Stateful`` objects (``deepspeed_stateful``), then
the plugins' ``deepspeed_load_checkpoint`` hook, which sees the restored engine and the loaded
model-states dict. Files are read with ``weights_only=True``.
"""
import os

from deepspeed import comm as dist
from deepspeed.checkpoint import collective, layout
from deepspeed.checkpoint.atomic import load_file
from deepspeed.checkpoint.engines import checkpoint_engine_for
from deepspeed.checkpoint.model_state import (client_state_of, restore_counters,
                                              restore_plugin_states)
from deepspeed.checkpoint.rng import restore_rng_state
from deepspeed.utils.logging import log_dist, logger


def _no_module_entry():
    return KeyError("the checkpoint has no 'module' entry (model weights) and no enabled "
                    "plugin loaded the weights from its own files; it is not a model-states "
                    "file, or it was saved by a plugin (keeping the weights in files of its own) "
                    "that is not enabled now")


def _load_module(engine, checkpoint_dir, state, strict, custom_load_fn):
    weights = state.get("module")
    if custom_load_fn is not None:
        if weights is None:
            raise _no_module_entry()
        custom_load_fn(src=weights, dst=engine.module)
        return
    module = engine.module
    handled = engine.hook.deepspeed_load_module_state(engine=engine, state_dict=weights,
                                                      strict=strict,
                                                      checkpoint_dir=checkpoint_dir, state=state)
    if handled is None and engine.config.load_universal_checkpoint:
        from deepspeed.checkpoint.universal import load_module_weights

        # per parameter: a rank may hold a piece of one, or a part of the model
        handled = load_module_weights(module, checkpoint_dir, weights)
    if handled is None and weights is None:
        raise _no_module_entry()
    missing_keys, unexpected_keys = handled if handled is not None else \
        module.load_state_dict(weights, strict=False)
    if not strict:
        return
    # parameters left out with save_checkpoint(exclude_frozen_parameters=True) are not missing
    excluded = set(state.get("frozen_param_shapes") or ()) - set(weights or ())
    missing = [k for k in missing_keys if k not in excluded]
    if missing or unexpected_keys:
        raise RuntimeError(
            f"Error(s) in loading state_dict for {type(module).__name__}: missing keys "
            f"{missing}, unexpected keys {unexpected_keys} (load_checkpoint("
            f"load_module_strict=False) ignores both)")


def _load_optimizer(engine, checkpoint_dir, tag, state):
    """Whether the optimizer state (and with it any fp32 master weights) was restored."""
    if engine.optimizer is None:
        return False
    if engine.hook.deepspeed_load_optimizer_state(engine=engine, checkpoint_dir=checkpoint_dir,
                                                  tag=tag, state=state):
        return True
    if engine.config.load_universal_checkpoint:  # ZeRO loads its own; this is stage 0
        from deepspeed.checkpoint.universal import load_into_optimizer

        load_into_optimizer(engine, checkpoint_dir)
        return True
    saved = state.get("optimizer")
    if saved is None:
        logger.warning(f"checkpoint '{checkpoint_dir}' holds no optimizer state (saved without "
                       f"an optimizer, or by a plugin that is not enabled now); the optimizer "
                       f"starts fresh")
        return False
    engine.optimizer.load_state_dict(saved)
    return True


def _refresh_master_weights(engine):
    """An optimizer that steps fp32 copies of 16-bit weights still holds the copies of the
    weights it was built with; without this, its next step would overwrite the loaded module.
    ``refresh_fp32_params`` is the name DeepSpeed's fp16/bf16/ZeRO optimizers use."""
    refresh = getattr(engine.optimizer, "refresh_fp32_params", None)
    if callable(refresh):
        refresh()


def _load_lr_scheduler(engine, saved, optimizer_loaded):
    scheduler = engine.lr_scheduler
    scheduler.load_state_dict(saved)
    if optimizer_loaded:
        return
    # The current learning rate lives in the optimizer's param groups, not in the scheduler's
    # state; with a fresh optimizer it would stay at the initial value until the next step.
    optimizer = getattr(scheduler, "optimizer", None) or engine.optimizer
    get_last_lr = getattr(scheduler, "get_last_lr", None)
    last = get_last_lr() if callable(get_last_lr) else None
    if last is not None and optimizer is not None and len(last) == len(optimizer.param_groups):
        for group, lr in zip(optimizer.param_groups, last):
            group["lr"] = lr


def _load_rng(checkpoint_dir, state):
    rank = dist.get_rank()
    path = os.path.join(checkpoint_dir, layout.rng_state_filename(rank))
    if not os.path.isfile(path):
        logger.warning(f"no RNG state for rank {rank} in '{checkpoint_dir}' (saved with "
                       f"{state.get('dp_world_size', '?')} data-parallel ranks); random "
                       f"generators keep their current state")
        return
    restore_rng_state(load_file(path))


def load_checkpoint(engine, load_dir, tag=None, load_module_strict=True,
                    load_optimizer_states=True, load_lr_scheduler_states=True,
                    load_module_only=False, custom_load_fn=None):
    """Load ``load_dir/tag`` (``tag=None``: the one ``load_dir/latest`` names) into ``engine``.

    Returns ``(load_path, client_state)``: the model-states file read and the keys the user
    saved as ``client_state``. Without ``tag``, a ``load_dir`` holding no ``latest`` file (empty,
    or not created yet: a script that resumes when it can, on its first run) loads nothing and
    returns ``(None, None)`` with a warning, as documented ("None if loading the checkpoint
    failed"); a ``tag`` that is not there is an error naming the tags that are.
    """
    load_dir = os.fspath(load_dir)
    checkpoint_engine_for(engine).wait()  # a pending asynchronous save may be what is loaded
    if tag is None:
        tag = layout.read_latest(load_dir) if os.path.isdir(load_dir) else None
        if tag is None:
            found = "" if os.path.isdir(load_dir) else f" (directory '{load_dir}' does not exist)"
            logger.warning(f"Unable to find latest file at {layout.latest_path(load_dir)}{found}, "
                           f"if trying to load latest checkpoint please ensure this file exists or "
                           f"pass an explicit checkpoint tag when loading a checkpoint. Nothing "
                           f"was loaded: load_checkpoint returns (None, None).")
            return None, None
    tag = layout.normalize_tag(tag)
    checkpoint_dir = layout.checkpoint_dir_for_load(load_dir, tag)
    path = engine.hook.deepspeed_model_states_file(engine=engine, checkpoint_dir=checkpoint_dir)
    if path is None:
        mp_rank = collective.model_parallel_rank(engine)
        if engine.config.load_universal_checkpoint and not os.path.isfile(
                os.path.join(checkpoint_dir, layout.model_states_filename(mp_rank))):
            mp_rank = 0  # a universal checkpoint has one model-states file for every rank
        path = layout.required_file(checkpoint_dir, layout.model_states_filename(mp_rank))
    state = load_file(path)

    _load_module(engine, checkpoint_dir, state, load_module_strict, custom_load_fn)
    optimizer_restored = (not load_module_only and load_optimizer_states
                          and _load_optimizer(engine, checkpoint_dir, tag, state))
    if not optimizer_restored:
        _refresh_master_weights(engine)
    if not load_module_only:
        if (load_lr_scheduler_states and engine.lr_scheduler is not None
                and state.get("lr_scheduler") is not None):
            _load_lr_scheduler(engine, state["lr_scheduler"], optimizer_restored)
        restore_counters(engine, state)
        _load_rng(checkpoint_dir, state)
        restore_plugin_states(engine, state)
    engine.hook.deepspeed_load_checkpoint(
        engine=engine, load_dir=load_dir, tag=tag, checkpoint_dir=checkpoint_dir, state=state,
        load_optimizer_states=load_optimizer_states,
        load_lr_scheduler_states=load_lr_scheduler_states, load_module_only=load_module_only)
    log_dist(f"loaded checkpoint '{tag}' from {load_dir}", ranks=[0])
    return path, client_state_of(state)
