"""The hook contract between the core engine and feature plugins: every hook, in one file.

Read this file to know everything a plugin can do. Conventions, as in pytest's hookspec.py:

- A plugin implements a hook by defining a function of the same name decorated with
  ``@deepspeed.hookimpl``. It may accept any *subset* of the arguments listed here, so new
  arguments can be added to a hook without breaking existing plugins.
- Only plugins enabled by the config take part (see ``deepspeed.plugin_manager``). The one
  exception is ``deepspeed_config_sections``, asked of every installed plugin, because the config
  has to be validated before anyone knows which plugins it enables.
- ``firstresult`` hooks stop at the first implementation that returns something other than None:
  that plugin "takes over" the job (e.g. ZeRO reduces gradients instead of the core all-reduce).
  Other hooks call every implementation; their return values are ignored unless documented.
- Arguments are passed by keyword. ``engine`` is the ``DeepSpeedEngine`` calling the hook.
"""
import pluggy

PROJECT_NAME = "deepspeed"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@hookspec
def deepspeed_config_sections():
    """Return the top-level config sections this plugin owns.

    Returns a ``dict`` mapping a top-level key (e.g. ``"zero_optimization"``) to a
    ``deepspeed.config.DeepSpeedConfigModel`` subclass that validates it. Called on every
    *installed* plugin before the config is validated. By default a plugin is enabled when one
    of its sections is present in the user's config and, if the section has an ``enabled``
    field, that field is true. Two plugins claiming the same key is an error naming both.
    """


# ---------------------------------------------------------------------------------------------
# Engine set-up, in the order the engine calls them
# ---------------------------------------------------------------------------------------------
@hookspec
def deepspeed_engine_init(engine, config):
    """Called once per engine, after the config is validated, the distributed backend is up and
    the model sits on its device, and before the optimizer is created or wrapped.

    Plugins read their section with ``config.section(key)`` and prepare per-engine state:
    process groups, topology, buffers. Return value ignored.
    """


@hookspec(firstresult=True)
def deepspeed_build_optimizer(engine, name, params, optimizer_params):
    """Build the optimizer the config names when the core does not know ``name`` (first result
    wins).

    ``name`` is ``optimizer.type`` as written (e.g. ``"OneBitAdam"``), ``params`` the model
    parameters or param-group dicts, ``optimizer_params`` the ``optimizer.params`` dict. Return
    a ``torch.optim.Optimizer`` or None when the name is not yours.
    """


@hookspec(firstresult=True)
def deepspeed_wrap_optimizer(engine, optimizer):
    """Offer to replace the optimizer the engine will step (first result wins).

    ``optimizer`` is the basic optimizer built from the config or given by the client (may be
    None for inference-only engines). Return the replacement (e.g. a ZeRO or 1-bit optimizer
    wrapping it) or None to leave it alone. The replacement also becomes the engine's precision
    policy, so it implements the protocol of ``deepspeed.precision.mixed_precision``
    (``scale_loss``, ``accumulate_micro_grads``, ``reduction_grads``, ``unscale_grads``,
    ``clip_grad_norm``, ``optimizer_step``, ``after_optimizer_step``, ``update_scale``,
    ``zero_grad``, ``master_params``); it keeps stepping ``optimizer`` (re-pointed at whatever
    tensors it chooses), which stays the engine's ``basic_optimizer`` that LR schedulers drive.
    """


# ---------------------------------------------------------------------------------------------
# The training step
# ---------------------------------------------------------------------------------------------
@hookspec
def deepspeed_before_forward(engine, args, kwargs):
    """Called at the start of ``engine(*args, **kwargs)``, before the module runs."""


@hookspec
def deepspeed_after_forward(engine, output):
    """Called after the module's forward returned ``output``."""


@hookspec
def deepspeed_before_backward(engine, loss):
    """Called at the start of ``engine.backward(loss)``, before autograd runs."""


@hookspec(firstresult=True)
def deepspeed_reduce_gradients(engine):
    """Reduce the gradients across the data-parallel group at an accumulation boundary.

    Return True when the plugin did the reduction (ZeRO's reduce-scatter, compressed
    communication, ...); return None to let the core average gradients with an all-reduce.
    """


@hookspec
def deepspeed_after_backward(engine, loss):
    """Called at the end of ``engine.backward(loss)``, after any gradient reduction."""


@hookspec
def deepspeed_before_step(engine):
    """Called by ``engine.step()`` at an accumulation boundary, before the optimizer steps."""


@hookspec
def deepspeed_after_step(engine):
    """Called by ``engine.step()`` at an accumulation boundary, after the optimizer and LR
    scheduler stepped, ``engine.global_steps`` advanced and the step's timers stopped (so a
    monitor can log this step's ``engine.timers``), before the progress report."""


@hookspec
def deepspeed_engine_destroy(engine):
    """Called by ``engine.destroy()``: undo what ``deepspeed_engine_init`` attached beyond the
    engine itself (module hooks, process-wide patches, gradient hooks), so nothing outlives
    the engine. All implementations run."""


# ---------------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------------
@hookspec
def deepspeed_comm_op(record):
    """Called after each ``deepspeed.comm`` operation while this engine lives.

    ``record`` carries the op name, message size in bytes, latency, group size and the
    algorithmic / bus bandwidth (see ``deepspeed.comm``). The engine only subscribes to
    ``deepspeed.comm`` when an enabled plugin implements this hook, so communication is not
    timed otherwise.
    """


@hookspec(firstresult=True)
def deepspeed_comm_summary(engine, show_straggler, return_dict):
    """Answer ``deepspeed.comm.log_summary(show_straggler, return_dict)`` for this engine
    (first result wins): print the per-op summary of the communication recorded so far and
    return what ``return_dict`` asks for. Only consulted while the engine is subscribed to
    ``deepspeed.comm`` (an enabled plugin implements ``deepspeed_comm_op``)."""


# ---------------------------------------------------------------------------------------------
# Checkpoints (see ``deepspeed.checkpoint``)
# ---------------------------------------------------------------------------------------------
@hookspec(firstresult=True)
def deepspeed_save_optimizer_state(engine, checkpoint_dir, tag):
    """Save the optimizer state yourself instead of the core (first result wins).

    Called on every rank by ``save_checkpoint`` while the checkpoint is written (``latest`` not
    yet updated). Return True when the plugin wrote the optimizer state (e.g. ZeRO's per-rank
    ``*_optim_states.pt`` shards, written with ``deepspeed.checkpoint.atomic_torch_save``); the
    core then stores ``optimizer: None`` in the model-states file. Return None to let the core
    store ``engine.optimizer.state_dict()`` there.
    """


@hookspec
def deepspeed_save_checkpoint(engine, save_dir, tag, checkpoint_dir, state,
                              exclude_frozen_parameters):
    """Add plugin state to a checkpoint being saved.

    Called on every rank by ``save_checkpoint`` after the optimizer hook and before any file is
    written. ``state`` is the dict that data-parallel rank 0 writes to
    ``checkpoint_dir/mp_rank_XX_model_states.pt`` (``checkpoint_dir`` is ``save_dir/tag``): add
    your entries to it (tensors and plain values only: the file is loaded with
    ``weights_only=True``; keys must not clash with the user's ``client_state``), or write
    per-rank files into ``checkpoint_dir`` with ``deepspeed.checkpoint.atomic_torch_save``. An
    exception on any rank fails the save on all ranks and leaves ``latest`` unchanged.
    Return value ignored.
    """


@hookspec(firstresult=True)
def deepspeed_load_module_state(engine, state_dict, strict):
    """Load the checkpoint's module weights yourself (first result wins), for plugins whose
    module holds only shards (ZeRO-3).

    Called on every rank by ``load_checkpoint`` with the saved ``module`` entry. Return the
    ``(missing_keys, unexpected_keys)`` of the load (the core applies ``strict`` to them) or
    None to let the core call ``engine.module.load_state_dict``.
    """


@hookspec(firstresult=True)
def deepspeed_load_optimizer_state(engine, checkpoint_dir, tag, state):
    """Restore the optimizer state yourself instead of the core (first result wins).

    Called on every rank by ``load_checkpoint`` when optimizer states are to be loaded (not with
    ``load_optimizer_states=False`` or ``load_module_only=True``). ``state`` is the loaded
    model-states dict. Return True when the plugin restored the optimizer (from its own files in
    ``checkpoint_dir``); None lets the core call ``engine.optimizer.load_state_dict``.
    """


@hookspec
def deepspeed_load_checkpoint(engine, load_dir, tag, checkpoint_dir, state,
                              load_optimizer_states, load_lr_scheduler_states, load_module_only):
    """Restore plugin state from a checkpoint.

    Called on every rank at the end of ``load_checkpoint``, after the core restored the module
    and (unless ``load_module_only``) the optimizer, scheduler, counters and RNG. ``state`` is the
    loaded model-states dict (read your entries from it); the flags are the caller's. Return
    value ignored.
    """


@hookspec(firstresult=True)
def deepspeed_consolidated_16bit_state_dict(engine, exclude_frozen_parameters):
    """Build the module's full state dict from shards (first result wins), for plugins whose
    module holds only shards (ZeRO-3). Collective. Return ``{"state_dict": dict or None}``:
    the dict on global rank 0, None on the other ranks; return None itself to let the core
    use ``engine.module.state_dict()``."""


@hookspec(firstresult=True)
def deepspeed_save_16bit_model(engine, save_dir, save_filename, exclude_frozen_parameters):
    """Save the 16-bit weights yourself (first result wins), for plugins whose module holds
    only shards (ZeRO-3).

    Called on every rank by ``save_16bit_model``. Return True when the plugin wrote
    ``save_dir/save_filename`` (gathered, full shapes, with
    ``deepspeed.checkpoint.atomic_torch_save``), False when it decided not to save (e.g.
    ``stage3_gather_16bit_weights_on_model_save`` is off); None lets the core save
    ``engine.module.state_dict()`` from global rank 0.
    """
