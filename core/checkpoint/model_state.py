"""The contents of ``mp_rank_XX_model_states.pt``: what the engine contributes, what the user
contributed (``client_state``), the plugins' ``Stateful`` objects (``plugin_states``), and how
the engine's counters and those objects come back on load.

The keys follow DeepSpeed's file so offline tools read both. Everything stored is a tensor or a
plain Python value (the config as a JSON-safe dict, versions as strings), because the file is
read back with ``torch.load(weights_only=True)``.
"""
import json
from collections import OrderedDict

from deepspeed.checkpoint.atomic import ensure_weights_only_loadable
from deepspeed.checkpoint.collective import model_parallel_world_size
from deepspeed.hooks import UNIVERSAL_CHECKPOINT_SLICE, Stateful, check_implements
from deepspeed.plugin_manager import call_each_plugin
from deepspeed.version import __version__

# The keys the engine itself writes. ``client_state`` keys may not shadow them: a user key named
# ``global_steps`` would silently replace the step counter on resume.
ENGINE_KEYS = (
    "module", "optimizer", "lr_scheduler", "global_steps", "global_samples", "skipped_steps",
    "micro_steps", "dp_world_size", "mp_world_size", "ds_config", "ds_version", "buffer_names",
    "param_shapes", "frozen_param_shapes", "shared_params", "client_state_keys",
    "plugin_states", "param_slices",
)
# {plugin name: {object name: state_dict()}} of the plugins' ``deepspeed_stateful`` objects
PLUGIN_STATES = "plugin_states"
# Written by DeepSpeed itself (not by this engine); never handed back as client state when
# loading a checkpoint DeepSpeed wrote, which has no ``client_state_keys`` entry.
FOREIGN_ENGINE_KEYS = ("sparse_tensor_module_names", "data_sampler", "random_ltd",
                       "frozen_param_fragments")
RESERVED_KEYS = frozenset(ENGINE_KEYS + FOREIGN_ENGINE_KEYS)


def frozen_parameter_names(module):
    return {name for name, p in module.named_parameters() if not p.requires_grad}


def module_state_dict(module, exclude_frozen_parameters=False):
    """``module.state_dict()``, minus parameters with ``requires_grad=False`` when asked."""
    state = module.state_dict()
    if exclude_frozen_parameters:
        for name in frozen_parameter_names(module):
            state.pop(name, None)
    return state


def _param_shapes(module, optimizer, exclude_frozen_parameters):
    """One ``OrderedDict(name -> shape)`` per optimizer param group, as ZeRO tools expect. An
    optimizer whose groups hold other tensors (fp32 master copies) gives one group of all
    trainable module parameters instead."""
    names = {id(p): n for n, p in module.named_parameters()}
    groups = []
    for group in getattr(optimizer, "param_groups", None) or []:
        shapes = OrderedDict((names[id(p)], p.shape) for p in group["params"] if id(p) in names)
        if shapes:
            groups.append(shapes)
    if not groups:
        groups = [OrderedDict((n, p.shape) for n, p in module.named_parameters()
                              if p.requires_grad or not exclude_frozen_parameters)]
    return groups


def _param_slices(module):
    """``{name: [dim, parts, index]}`` of the parameters this rank holds a piece of
    (``deepspeed.hooks.UNIVERSAL_CHECKPOINT_SLICE``): what ``ds_to_universal`` needs to join
    the model-parallel ranks' pieces into whole tensors."""
    return {n: [int(v) for v in getattr(p, UNIVERSAL_CHECKPOINT_SLICE)]
            for n, p in module.named_parameters() if hasattr(p, UNIVERSAL_CHECKPOINT_SLICE)}


def _shared_params(module):
    """Tied weights: ``{alias name: name of the parameter it shares}``."""
    first, shared = {}, {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if id(param) in first:
            shared[name] = first[id(param)]
        else:
            first[id(param)] = name
    return shared


def _plain_config(config):
    to_dict = getattr(config, "to_dict", None)
    resolved = to_dict() if callable(to_dict) else dict(getattr(config, "raw", {}) or {})
    return json.loads(json.dumps(resolved, default=str))


def engine_state(engine, exclude_frozen_parameters):
    """Everything the core stores except ``optimizer`` (whose owner is decided by a hook) and
    the user's ``client_state``."""
    module = engine.module
    weights = module_state_dict(module, exclude_frozen_parameters)
    scheduler = engine.lr_scheduler
    if scheduler is not None and not callable(getattr(scheduler, "state_dict", None)):
        raise TypeError(f"the LR scheduler ({type(scheduler).__name__}) has no state_dict(); a "
                        f"scheduler given to deepspeed.initialize must implement get_lr, step, "
                        f"state_dict and load_state_dict")
    state = {
        "module": weights,
        "buffer_names": [name for name, _ in module.named_buffers() if name in weights],
        "param_shapes": _param_shapes(module, engine.optimizer, exclude_frozen_parameters),
        "frozen_param_shapes": OrderedDict((n, p.shape) for n, p in module.named_parameters()
                                           if not p.requires_grad),
        "shared_params": _shared_params(module),
        "lr_scheduler": scheduler.state_dict() if scheduler is not None else None,
        "global_steps": int(engine.global_steps),
        "global_samples": int(engine.global_samples),
        "skipped_steps": int(engine.skipped_steps),
        "micro_steps": int(engine.micro_steps),
        "dp_world_size": int(engine.dp_world_size),
        "mp_world_size": int(model_parallel_world_size(engine)),
        "ds_config": _plain_config(engine.config),
        "ds_version": str(__version__),
    }
    slices = _param_slices(module)
    if slices:  # only a model split over ranks has any
        state["param_slices"] = slices
    return state


def merge_client_state(state, client_state):
    """Put the user's keys at the top level (DeepSpeed's layout) and remember which they were,
    so loading hands back exactly those."""
    clashes = sorted(str(k) for k in client_state if k in state or k in RESERVED_KEYS)
    if clashes:
        raise ValueError(f"client_state key(s) {clashes} are reserved for the engine's own "
                         f"checkpoint entries or an enabled plugin's; rename them "
                         f"(reserved: {sorted(RESERVED_KEYS | set(state))})")
    state.update(client_state)
    state["client_state_keys"] = list(client_state)


def client_state_of(state):
    keys = state.get("client_state_keys")
    if keys is not None:
        return {k: state[k] for k in keys if k in state}
    return {k: v for k, v in state.items() if k not in RESERVED_KEYS}


def restore_counters(engine, state):
    """Step counters, so LR schedules, logging and accumulation boundaries continue where they
    stopped. Files from older writers may lack some counters; they are derived then."""
    steps = int(state["global_steps"])
    engine.global_steps = steps
    engine.global_samples = int(state.get("global_samples", steps * engine.train_batch_size()))
    engine.skipped_steps = int(state.get("skipped_steps", 0))
    engine.micro_steps = int(state.get("micro_steps",
                                       steps * engine.gradient_accumulation_steps()))


def _stateful_objects(engine):
    """``[(plugin, name, object)]`` the enabled plugins hand over through
    ``deepspeed_stateful``."""
    found = []
    for plugin, objects in call_each_plugin(engine.hook.deepspeed_stateful, engine=engine):
        for name, obj in (objects or {}).items():
            found.append((plugin, name, check_implements(
                obj, Stateful, f"plugin '{plugin}''s deepspeed_stateful (entry {name!r})")))
    return found


def plugin_states(engine, what):
    """The ``plugin_states`` entry of a model-states file: each Stateful object's state under
    its plugin's name, checked to load with ``weights_only=True`` (``what`` names the
    checkpoint in the error)."""
    saved = {}
    for plugin, name, obj in _stateful_objects(engine):
        state = obj.state_dict()
        ensure_weights_only_loadable(state, what=what,
                                     root=f"{PLUGIN_STATES}[{plugin!r}][{name!r}]")
        saved.setdefault(plugin, {})[name] = state
    return saved


def restore_plugin_states(engine, state):
    """Hand each Stateful object its saved state. A file written before ``plugin_states``
    existed kept a plugin's entry at the top level under the object's name; an object the file
    has nothing for keeps its state."""
    saved = state.get(PLUGIN_STATES)
    for plugin, name, obj in _stateful_objects(engine):
        if saved is None:
            entry = state.get(name)
        else:
            entry = saved.get(plugin, {}).get(name)
        if entry is not None:
            obj.load_state_dict(entry)
