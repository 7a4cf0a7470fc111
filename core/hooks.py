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
    wrapping it) or None to leave it alone.
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
    scheduler stepped and ``engine.global_steps`` advanced."""


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
