"""``save_checkpoint`` and ``save_16bit_model``: the engine's state to disk, crash-safely.

A save runs in three collective phases, each ending in an all-ranks agreement (see
``collective.on_all_ranks``):

1. check the tag (same on every rank, a valid directory name) and the client state;
2. every rank writes its files (its RNG state; plugins their own files through the
   ``deepspeed_save_checkpoint`` / ``deepspeed_save_optimizer_state`` hooks), and the
   model-states writer writes ``mp_rank_XX_model_states.pt``;
3. only when all ranks succeeded, ``latest`` is pointed at the new tag (the commit).

Each file is replaced atomically, so a save that dies at any point leaves the previous
``latest`` and every file of the checkpoint it names intact.

Files go through the engine's checkpoint engine (``checkpoint.checkpoint_engine``; plugins'
``atomic_torch_save`` calls inside the hooks are routed to it too). With the asynchronous
engine phase 2 only snapshots the state and phase 3 happens later: the previous save is
committed at the start of this one, and ``engine.checkpoint_engine.wait()`` commits the last.
"""
import os

from deepspeed import comm as dist
from deepspeed.checkpoint import collective, layout
from deepspeed.checkpoint.atomic import (atomic_torch_save, atomic_write_text,
                                         ensure_weights_only_loadable, writing_through)
from deepspeed.checkpoint.engines import checkpoint_engine_for
from deepspeed.checkpoint.model_state import (PLUGIN_STATES, engine_state, merge_client_state,
                                              module_state_dict, plugin_states)
from deepspeed.checkpoint.rng import capture_rng_state
from deepspeed.utils.logging import log_dist, logger


def _prepare(engine, tag, client_state):
    tag = layout.normalize_tag(layout.default_tag(engine.global_steps) if tag is None else tag)
    if client_state is None:
        client_state = {}
    if not isinstance(client_state, dict):
        raise TypeError(f"client_state must be a dict, got {type(client_state).__name__}")
    # checked on every rank before anything is written, so all ranks fail the same way
    ensure_weights_only_loadable(client_state, what=f"checkpoint '{tag}'", root="client_state")
    return tag, dict(client_state)


def _write_rank_files(engine, save_dir, tag, client_state, exclude_frozen_parameters,
                      writes_model_states):
    checkpoint_dir = os.path.join(save_dir, tag)
    os.makedirs(checkpoint_dir, exist_ok=True)
    mp_rank = collective.model_parallel_rank(engine)
    model_states = os.path.join(checkpoint_dir, layout.model_states_filename(mp_rank))
    if writes_model_states and os.path.exists(model_states):
        logger.warning(f"checkpoint '{checkpoint_dir}' already exists; its files are replaced "
                       f"one by one (each atomically)")
    state = engine_state(engine, exclude_frozen_parameters)
    hook = engine.hook
    plugin_saved_optimizer = hook.deepspeed_save_optimizer_state(
        engine=engine, checkpoint_dir=checkpoint_dir, tag=tag)
    optimizer = engine.optimizer
    state["optimizer"] = (optimizer.state_dict()
                          if optimizer is not None and not plugin_saved_optimizer else None)
    hook.deepspeed_save_checkpoint(engine=engine, save_dir=save_dir, tag=tag,
                                   checkpoint_dir=checkpoint_dir, state=state,
                                   exclude_frozen_parameters=exclude_frozen_parameters)
    state[PLUGIN_STATES] = plugin_states(engine, what=f"checkpoint '{tag}'")
    merge_client_state(state, client_state)
    if writes_model_states:
        atomic_torch_save(state, model_states)
    atomic_torch_save(capture_rng_state(),
                      os.path.join(checkpoint_dir, layout.rng_state_filename(dist.get_rank())))


def _on_commit(engine, save_dir, tag, save_latest, agreed):
    """The collective end of a save: every rank's files are durable (agreed on first when the
    writes happened in the background), then ``latest`` names ``tag``."""
    def commit(write_error):
        if not agreed:
            def check():
                if write_error is not None:
                    raise write_error
            collective.on_all_ranks(
                engine, f"writing checkpoint '{tag}' to '{save_dir}' ('latest' not updated)",
                check)
        if save_latest:
            collective.on_all_ranks(
                engine, f"updating '{layout.latest_path(save_dir)}' to '{tag}'",
                lambda: (atomic_write_text(layout.latest_path(save_dir), tag)
                         if collective.writes_shared_files(engine) else None))
        log_dist(f"{'committed' if not agreed else 'saved'} checkpoint '{tag}' to {save_dir}",
                 ranks=[0])
    return commit


def save_checkpoint(engine, save_dir, tag=None, client_state={}, save_latest=True,
                    exclude_frozen_parameters=False):
    """Save ``engine`` under ``save_dir/tag`` (default ``global_step<N>``); collective: every
    rank must call it. ``client_state`` comes back from ``load_checkpoint``. Returns True."""
    save_dir = os.fspath(save_dir)
    writer = checkpoint_engine_for(engine)
    writer.wait()  # an earlier asynchronous save is committed before a new one starts
    tag, client_state = collective.on_all_ranks(
        engine, f"checkpoint save to '{save_dir}'", lambda: _prepare(engine, tag, client_state))
    collective.validate_tag(engine, tag)
    writes_model_states = collective.writes_model_states(engine)
    writer.begin(tag)
    try:
        with writing_through(writer):
            collective.on_all_ranks(
                engine, f"{'snapshotting' if writer.is_async else 'writing'} checkpoint "
                        f"'{tag}' to '{save_dir}' ('latest' not updated)",
                lambda: _write_rank_files(engine, save_dir, tag, client_state,
                                          exclude_frozen_parameters, writes_model_states))
    except BaseException:
        writer.abort(tag)
        raise
    writer.end(tag, _on_commit(engine, save_dir, tag, save_latest, agreed=not writer.is_async))
    if not writer.is_async:
        writer.commit(tag)
    else:
        log_dist(f"checkpoint '{tag}' snapshotted; writing to {save_dir} in the background",
                 ranks=[0])
    return True


def save_16bit_model(engine, save_dir, save_filename="pytorch_model.bin",
                     exclude_frozen_parameters=False):
    """Save the module's weights in the dtype it trains in (16-bit under fp16/bf16) as one
    ``state_dict`` file. Collective. Returns True when saved; a plugin that shards the weights
    decides through ``deepspeed_save_16bit_model`` and may return False."""
    handled = engine.hook.deepspeed_save_16bit_model(
        engine=engine, save_dir=save_dir, save_filename=save_filename,
        exclude_frozen_parameters=exclude_frozen_parameters)
    if handled is not None:
        return bool(handled)
    save_dir = os.fspath(save_dir)
    path = os.path.join(save_dir, save_filename)

    def write():
        if collective.writes_shared_files(engine):
            os.makedirs(save_dir, exist_ok=True)
            atomic_torch_save(module_state_dict(engine.module, exclude_frozen_parameters), path)

    collective.on_all_ranks(engine, f"saving the 16-bit model to '{path}'", write)
    return True
