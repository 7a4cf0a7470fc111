"""The hook contract between the core engine and feature plugins: every hook, in one file.

(Over 600 lines on purpose: docs/architecture.md makes this the single file a plugin author reads;
splitting it would split the contract.)

Read this file to know everything a plugin can do. Conventions, as in pytest's hookspec.py:

- A plugin implements a hook by defining a function of the same name decorated with
  ``@deepspeed.hookimpl``. It may accept any *subset* of the arguments listed here, so new
  arguments can be added to a hook without breaking existing plugins.
- Only plugins enabled by the config take part (see ``deepspeed.plugin_manager``). Nine
  exceptions are asked of every installed plugin because no engine exists when they are needed:
  ``deepspeed_config_sections`` (the config has to be validated before anyone knows which
  plugins it enables), ``deepspeed_engine_for_model`` / ``deepspeed_enable_for_model`` (a model
  may need a plugin, which the config cannot say), ``deepspeed_comms_logger`` (``deepspeed.comm.configure`` without an
  engine), ``deepspeed_init_inference`` (``deepspeed.init_inference`` builds no training
  engine), ``deepspeed_tp_model_init`` (``deepspeed.tp_model_init`` runs before one),
  ``deepspeed_batch_size`` (the batch keys are resolved while the config is built) and
  ``deepspeed_launcher_arguments`` / ``deepspeed_launcher_command`` (the ``deepspeed`` command
  runs before any engine).
- ``firstresult`` hooks stop at the first implementation that returns something other than None:
  that plugin "takes over" the job (e.g. ZeRO reduces gradients instead of the core all-reduce).
  Other hooks call every implementation; their return values are ignored unless documented.
- Arguments are passed by keyword. ``engine`` is the ``DeepSpeedEngine`` calling the hook; what
  a plugin may use of it is the ``Engine`` protocol below, and nothing else.

Besides the hooks, the objects that cross the boundary are declared here as ``typing.Protocol``
classes (the engine itself, the precision policy a wrapping plugin returns, a comms logger, a
monitor, the engine's timers, a plugin's checkpointed ``Stateful`` objects, the per-parameter
state access behind ``deepspeed.utils.safe_get_*``): a plugin written from this file alone
can take part in every interaction the core has with plugins. Anything a plugin or the core
needs from the other and that is not listed here is a bug in this file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Protocol,
                    Sequence, Tuple, Union, runtime_checkable)

import pluggy

if TYPE_CHECKING:  # annotations only: importing this file loads neither torch nor the core
    import argparse

    import torch

    from deepspeed.comm import CommRecord, CommsLoggerSettings
    from deepspeed.config import DeepSpeedConfig
    from deepspeed.topology import Topology

PROJECT_NAME = "deepspeed"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
@hookspec
def deepspeed_config_sections() -> Optional[Dict[str, type]]:
    """Return the top-level config sections this plugin owns.

    Returns a ``dict`` mapping a top-level key (e.g. ``"zero_optimization"``) to a
    ``deepspeed.config.DeepSpeedConfigModel`` subclass that validates it. Called on every
    *installed* plugin before the config is validated. By default a plugin is enabled when one
    of its sections is present in the user's config and, if the section has an ``enabled``
    field, that field is true. Two plugins claiming the same key is an error naming both.
    """


@dataclass(frozen=True)
class EngineChoice:
    """A plugin's answer to ``deepspeed_engine_for_model``."""

    engine_class: type  # a ``deepspeed.engine.DeepSpeedEngine`` subclass
    # the model's own process-group layout (an ``mpu``: ``get_data_parallel_group()`` ...), used
    # for the config's batch arithmetic and by the engine when the caller passed none
    mpu: Any = None


@hookspec(firstresult=True)
def deepspeed_engine_for_model(model: torch.nn.Module,
                               config: Dict[str, Any]) -> Optional[EngineChoice]:
    """Claim ``model``: return an ``EngineChoice`` when this plugin's engine must drive it (a
    ``PipelineModule`` gets the ``PipelineEngine``), None otherwise; first result wins.

    Asked of every *installed* plugin by ``deepspeed.initialize`` before the config is
    validated, because what a model needs cannot be read from the config. ``config`` is the
    user's config as a plain dict, not yet validated: a plugin that lays the model out from its
    own section (the pipeline's ``stages``) validates that section itself. The plugin that
    answers is enabled for that engine whatever its config sections say."""


@hookspec
def deepspeed_enable_for_model(model: torch.nn.Module) -> Optional[bool]:
    """Return True when this plugin must take part in the engine built for ``model`` whatever
    the config says (``deepspeed.moe`` for a model holding MoE layers: their checkpoints and
    the features that must know expert groups). Asked of every installed plugin, like
    ``deepspeed_engine_for_model``, which it complements without claiming the engine class."""


@hookspec(firstresult=True)
def deepspeed_batch_size(config: Dict[str, Any],
                         world_size: int) -> Optional[Tuple[int, int, int]]:
    """Decide the batch triangle yourself (first result wins): elastic training fixes one
    global batch size for many world sizes, so the config's own batch keys do not apply.

    Asked of every *installed* plugin by ``DeepSpeedConfig`` (when built with a plugin catalog,
    as ``deepspeed.initialize`` does), after the sections are validated and before the batch
    keys are resolved, because the answer decides the config itself. ``config`` is the user's
    config as a plain dict, ``world_size`` the data-parallel world size. Return
    ``(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps)`` or
    None to let the core resolve the config's keys."""


@hookspec(firstresult=True)
def deepspeed_launcher_command(args: argparse.Namespace, argv: List[str]) -> Optional[int]:
    """Run the ``deepspeed`` command yourself for a launcher flag your plugin owns
    (``--autotuning``, ``--elastic_training``), first result wins.

    Asked of every *installed* plugin by the runner (``deepspeed.launcher.runner``) after the
    flags are parsed and checked, and only when one of those flags is given, so the launcher
    never imports a feature. ``args`` is the parsed ``argparse.Namespace``, ``argv`` the
    command line as given (without the program name), which a plugin may re-run with changes
    through ``deepspeed.launcher.runner.main`` or ``python -m deepspeed.launcher.runner``.
    Return the exit status, or None when the flags are not yours; with no answer the runner
    reports that no installed plugin provides the flag."""


@hookspec(firstresult=True)
def deepspeed_init_inference(model: torch.nn.Module, config: Union[Dict[str, Any], str, None],
                             kwargs: Dict[str, Any]) -> Optional[torch.nn.Module]:
    """Build the inference engine of ``deepspeed.init_inference(model, config, **kwargs)``
    (first result wins): ``config`` is what the caller passed (a dict, a JSON file path or
    None), ``kwargs`` the keyword arguments as a dict. Return the engine (upstream's
    ``InferenceEngine``: a module whose ``.module`` is the wrapped model), or None to leave
    the call to another plugin.

    Asked of every *installed* plugin, since inference has no training config to enable a
    plugin with; the ``inference`` plugin (``deepspeed.inference``) answers it. With no
    answer, ``init_inference`` raises an error naming that plugin."""


@hookspec(firstresult=True)
def deepspeed_tp_model_init(model: torch.nn.Module, tp_size: int, dtype: Optional[torch.dtype],
                            config: Union[Dict[str, Any], str, None],
                            kwargs: Dict[str, Any]) -> Optional[torch.nn.Module]:
    """Split ``model`` for tensor-parallel training over ``tp_size`` ranks
    (``deepspeed.tp_model_init(model, tp_size, dtype, config=None, **kwargs)``, which
    Transformers calls before ``deepspeed.initialize`` when the config sets
    ``tensor_parallel.autotp_size`` > 1), first result wins. ``config`` is what the caller
    passed (the training config dict, a JSON path, or None), ``kwargs`` the other keyword
    arguments. Return the model, or None to leave the call to another plugin.

    Asked of every *installed* plugin (no engine exists yet; only called for ``tp_size`` > 1);
    the ``tensor_parallel`` plugin answers it. With no answer the call fails naming the
    ``tensor_parallel`` section's missing plugin."""


# ---------------------------------------------------------------------------------------------
# Engine set-up, in the order the engine calls them
# ---------------------------------------------------------------------------------------------
@hookspec(firstresult=True)
def deepspeed_model_parallel_unit(engine: Engine, config: DeepSpeedConfig, mpu: Any) -> Any:
    """The model-parallel unit (an ``mpu``: ``get_data_parallel_group()``,
    ``get_model_parallel_group()`` ...) of an engine whose plugin splits the model itself
    (AutoTP training), first result wins. ``mpu`` is the caller's (``deepspeed.initialize(
    mpu=...)``, or None): return it or your own unit, or raise when the two cannot work
    together. Called in the engine's constructor, after the config is validated and before
    anything reads the data-parallel group; ``engine.module`` is the model (the plugin may
    split it in place, keeping its Parameter objects). Return None when this plugin does not
    split the model.

    The engine then uses the answer like a caller's ``mpu`` (gradients averaged and ZeRO
    partitions laid out over its data-parallel group, checkpoints written per model-parallel
    rank, ``deepspeed.utils.groups`` answering from it) and also sums the global gradient norm
    over its model-parallel group when that has more than one rank: the plugin marks
    ``REPLICATED_PARAM`` on the parameter copies another rank of that group counts. (The
    config's batch arithmetic was done before, over every rank: ``train_batch_size`` counts
    each tensor-parallel rank's micro-batch, as Transformers' "auto" values do.)"""


@hookspec
def deepspeed_engine_init(engine: Engine, config: DeepSpeedConfig) -> None:
    """Called once per engine, after the config is validated, the distributed backend is up and
    the model sits on its device, and before the optimizer is created or wrapped.

    Plugins read their section with ``config.section(key)`` and prepare per-engine state:
    process groups, topology, buffers. Return value ignored.
    """


@hookspec
def deepspeed_engine_attributes(engine: Engine) -> Optional[Dict[str, Any]]:
    """Return ``{name: value}`` the engine exposes to its users for this plugin: upstream's
    per-feature engine members (``engine.get_pld_theta()``, ``engine.quantize_bits()``). A
    callable is called with the user's arguments only (close over the engine if it needs it).

    Called once, right after ``deepspeed_engine_init``. The core sets the names on the engine; a
    name the engine already has, or that two plugins return, is an error naming them. Plugins
    never set attributes on the engine themselves."""


@hookspec(firstresult=True)
def deepspeed_optimizer_device(engine: Engine) -> Optional[str]:
    """The device type the basic optimizer will step on when a plugin keeps the fp32 master
    weights somewhere other than the parameters' device (first result wins): ZeRO-Offload
    answers ``"cpu"`` for ``offload_optimizer.device`` cpu or nvme, so the core builds
    ``DeepSpeedCPUAdam`` instead of a device Adam. None: the parameters' own device."""


@hookspec(firstresult=True)
def deepspeed_build_optimizer(engine: Engine, name: str, params: Iterable[Any],
                              optimizer_params: Dict[str, Any]) -> Optional[torch.optim.Optimizer]:
    """Build the optimizer the config names when the core does not know ``name`` (first result
    wins).

    ``name`` is ``optimizer.type`` as written (e.g. ``"OneBitAdam"``), ``params`` the model
    parameters or param-group dicts, ``optimizer_params`` the ``optimizer.params`` dict. Return
    a ``torch.optim.Optimizer`` or None when the name is not yours.
    """


@hookspec(firstresult=True)
def deepspeed_wrap_optimizer(engine: Engine, optimizer: Optional[torch.optim.Optimizer]
                             ) -> Optional[PrecisionPolicy]:
    """Offer to replace the optimizer the engine will step (first result wins).

    ``optimizer`` is the basic optimizer built from the config or given by the client (may be
    None for inference-only engines). Return the replacement (e.g. a ZeRO or 1-bit optimizer
    wrapping it) or None to leave it alone. The replacement also becomes the engine's precision
    policy, so it implements ``PrecisionPolicy`` (below); it keeps stepping ``optimizer``
    (re-pointed at whatever tensors it chooses), which stays the engine's ``basic_optimizer``
    that LR schedulers drive.
    """


# ---------------------------------------------------------------------------------------------
# The training step
# ---------------------------------------------------------------------------------------------
@hookspec
def deepspeed_before_forward(engine: Engine, args: Tuple[Any, ...],
                             kwargs: Dict[str, Any]) -> None:
    """Called at the start of ``engine(*args, **kwargs)``, before the module runs."""


@hookspec(firstresult=True)
def deepspeed_forward_inputs(engine: Engine, args: Tuple[Any, ...], kwargs: Dict[str, Any]
                             ) -> Optional[Tuple[Tuple[Any, ...], Dict[str, Any]]]:
    """Replace the inputs of this ``engine(*args, **kwargs)`` call (first result wins).

    Called after ``deepspeed_before_forward``. Return ``(args, kwargs)`` to run the module on
    those instead (the data-efficiency plugin truncates a batch to the curriculum's sequence
    length and adds ``curriculum_seqlen`` / ``pld_theta`` keywords), or None to leave them.
    """


@hookspec
def deepspeed_after_forward(engine: Engine, output: Any) -> None:
    """Called after the module's forward returned ``output``."""


@hookspec
def deepspeed_before_backward(engine: Engine, loss: torch.Tensor) -> None:
    """Called at the start of ``engine.backward(loss)``, before autograd runs."""


@hookspec(firstresult=True)
def deepspeed_reduce_gradients(engine: Engine) -> Optional[bool]:
    """Reduce the gradients across the data-parallel group at an accumulation boundary.

    Return True when the plugin did the reduction (ZeRO's reduce-scatter, compressed
    communication, ...); return None to let the core average gradients with an all-reduce.
    """


@hookspec
def deepspeed_after_backward(engine: Engine, loss: Optional[torch.Tensor]) -> None:
    """Called at the end of ``engine.backward(loss)``, after any gradient reduction."""


@hookspec
def deepspeed_before_step(engine: Engine) -> None:
    """Called by ``engine.step()`` at an accumulation boundary, before the optimizer steps."""


@hookspec
def deepspeed_after_step(engine: Engine) -> None:
    """Called by ``engine.step()`` at an accumulation boundary, after the optimizer and LR
    scheduler stepped, ``engine.global_steps`` advanced and the step's timers stopped (so a
    monitor can log this step's ``engine.timers``), before the progress report."""


@hookspec
def deepspeed_engine_destroy(engine: Engine) -> None:
    """Called by ``engine.destroy()``: undo what ``deepspeed_engine_init`` attached beyond the
    engine itself (module hooks, process-wide patches, gradient hooks), so nothing outlives
    the engine. All implementations run."""


@hookspec(firstresult=True)
def deepspeed_data_loader(engine: Engine, dataset: Any, batch_size: int, route: Optional[str],
                          pin_memory: bool, data_sampler: Any, collate_fn: Optional[Callable],
                          num_local_io_workers: Optional[int]) -> Optional[Iterable[Any]]:
    """Build the loader ``engine.deepspeed_io`` returns (first result wins), for plugins that
    choose the samples themselves (curriculum data sampling). Arguments are
    ``deepspeed_io``'s, ``batch_size`` already resolved to the micro batch size; ``route`` is
    ``"train"`` for ``deepspeed.initialize(training_data=...)``. Return an iterable of batches,
    or None to let the core shard ``dataset`` with a ``DistributedSampler``."""


# ---------------------------------------------------------------------------------------------
# Questions the engine answers for its users, from the plugin that knows
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sharding:
    """How a plugin shards the training state across the data-parallel group, in ZeRO's terms
    (the vocabulary of the upstream API the engine answers: ``zero_optimization_stage()``)."""

    stage: int  # 0 nothing, 1 optimizer states, 2 and gradients, 3 and parameters
    # a 16-bit save (``save_16bit_model``, HF Trainer) gathers the sharded weights first
    gathers_16bit_weights_on_save: bool = False

    @property
    def partitions_gradients(self) -> bool:
        return self.stage >= 2


NOT_SHARDED = Sharding(stage=0)


@hookspec(firstresult=True)
def deepspeed_sharding(engine: Engine) -> Optional[Sharding]:
    """Return a ``Sharding`` when this plugin shards the model's training state (first result
    wins); None when it does not. The engine answers ``zero_optimization_stage()``,
    ``zero_gather_16bit_weights_on_model_save()`` and refuses ``no_sync()`` with partitioned
    gradients from it; without an answer the state is not sharded (``NOT_SHARDED``)."""


@hookspec(firstresult=True)
def deepspeed_engine_monitor(engine: Engine) -> Optional[Monitor]:
    """Return the object ``engine.monitor`` exposes to the training script (a ``Monitor``:
    ``write_events([(name, value, step), ...])``), first result wins; None when this plugin
    does not monitor. Without an answer ``engine.monitor`` is None."""


# ---------------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------------
@hookspec
def deepspeed_comm_op(record: CommRecord) -> None:
    """Called after each ``deepspeed.comm`` operation while this engine lives.

    ``record`` carries the op name, message size in bytes, latency, group size and the
    algorithmic / bus bandwidth (see ``deepspeed.comm``). The engine only subscribes to
    ``deepspeed.comm`` when an enabled plugin implements this hook, so communication is not
    timed otherwise.
    """


@hookspec(firstresult=True)
def deepspeed_comms_logger(settings: CommsLoggerSettings) -> Optional[CommsLogger]:
    """Return a ``CommsLogger`` that logs every ``deepspeed.comm`` op according to the live
    ``settings`` (a ``deepspeed.comm.CommsLoggerSettings``, changed in place by
    ``deepspeed.comm.configure``), first result wins.

    Asked of every *installed* plugin, like ``deepspeed_config_sections``, when
    ``deepspeed.comm.configure(enabled=True)`` (or ``init_distributed(config=...)``) turns
    communication logging on without an engine; the core registers the answer as a comm
    observer and removes it when logging is switched off again."""


@hookspec(firstresult=True)
def deepspeed_comm_summary(engine: Engine, show_straggler: bool, return_dict: bool) -> Any:
    """Answer ``deepspeed.comm.log_summary(show_straggler, return_dict)`` for this engine
    (first result wins): print the per-op summary of the communication recorded so far and
    return what ``return_dict`` asks for. Only consulted while the engine is subscribed to
    ``deepspeed.comm`` (an enabled plugin implements ``deepspeed_comm_op``)."""


# ---------------------------------------------------------------------------------------------
# Checkpoints (see ``deepspeed.checkpoint``)
# ---------------------------------------------------------------------------------------------
@hookspec
def deepspeed_stateful(engine: Engine) -> Optional[Dict[str, Stateful]]:
    """Return ``{name: Stateful}``: this plugin's objects whose state checkpoints carry
    (schedulers, counters, a data loader's position).

    ``save_checkpoint`` stores each ``state_dict()`` in the model-states file under the
    plugin's name and ``name`` (``state["plugin_states"][plugin][name]``), checked to hold
    tensors and plain values only (the file is loaded with ``weights_only=True``).
    ``load_checkpoint`` hands each saved entry back to ``load_state_dict`` after the core restored
    the counters and before ``deepspeed_load_checkpoint`` (not with ``load_module_only``); an
    object the checkpoint has no entry for keeps its state. A checkpoint written before this
    hook existed, with the plugin's entries at the top level of the file, is read from the
    top-level key ``name`` instead. Asked at every save and load, so the answer may change."""


@hookspec(firstresult=True)
def deepspeed_save_optimizer_state(engine: Engine, checkpoint_dir: str,
                                   tag: str) -> Optional[bool]:
    """Save the optimizer state yourself instead of the core (first result wins).

    Called on every rank by ``save_checkpoint`` while the checkpoint is written (``latest`` not
    yet updated). Return True when the plugin wrote the optimizer state (e.g. ZeRO's per-rank
    ``*_optim_states.pt`` shards, written with ``deepspeed.checkpoint.atomic_torch_save``); the
    core then stores ``optimizer: None`` in the model-states file. Return None to let the core
    store ``engine.optimizer.state_dict()`` there.
    """


@hookspec
def deepspeed_save_checkpoint(engine: Engine, save_dir: str, tag: str, checkpoint_dir: str,
                              state: Dict[str, Any], exclude_frozen_parameters: bool) -> None:
    """Add files or file entries to a checkpoint being saved: per-rank files, and entries other
    tools read (ZeRO's ``param_shapes``, the MoE expert layout). State the plugin itself gets
    back on load goes through ``deepspeed_stateful`` instead.

    Called on every rank by ``save_checkpoint`` after the optimizer hook and before any file is
    written. ``state`` is the dict that data-parallel rank 0 writes to
    ``checkpoint_dir/mp_rank_XX_model_states.pt`` (``checkpoint_dir`` is ``save_dir/tag``): add
    your entries to it (tensors and plain values only: the file is loaded with
    ``weights_only=True``; keys must not clash with the user's ``client_state``), or write
    per-rank files into ``checkpoint_dir`` with ``deepspeed.checkpoint.atomic_torch_save``. A
    plugin that writes the weights into files of its own may set ``state["module"] = None``
    (and then loads them in ``deepspeed_load_module_state``). An exception on any rank fails
    the save on all ranks and leaves ``latest`` unchanged. Return value ignored.
    """


@hookspec(firstresult=True)
def deepspeed_model_states_file(engine: Engine, checkpoint_dir: str) -> Optional[str]:
    """The model-states file this rank reads in ``load_checkpoint`` (first result wins), for
    plugins whose checkpoints may be loaded with another model-parallel layout than they were
    saved with: a pipeline saved with 2 stages has no ``mp_rank_02_model_states.pt`` for the
    third stage of 4, which then reads stage 0's file (its counters, scheduler and config are
    the same on every stage; the weights come from the plugin's own files).

    Called on every rank with ``checkpoint_dir`` (``load_dir/tag``). Return the path of an
    existing file, or None to let the core read
    ``checkpoint_dir/mp_rank_<model-parallel rank:02d>_model_states.pt``.
    """


@hookspec(firstresult=True)
def deepspeed_load_module_state(engine: Engine, state_dict: Optional[Dict[str, Any]],
                                strict: bool, checkpoint_dir: str, state: Dict[str, Any]
                                ) -> Optional[Tuple[List[str], List[str]]]:
    """Load the checkpoint's module weights yourself (first result wins), for plugins whose
    module holds only shards (ZeRO-3) or whose weights live in their own files (a pipeline's
    per-layer ``layer_XX-model_states.pt``, saved with ``module: None`` in the model-states
    file).

    Called on every rank by ``load_checkpoint`` (unless ``custom_load_fn`` was given) with the
    saved ``module`` entry (None when a plugin stored the weights elsewhere), the checkpoint's
    directory ``checkpoint_dir`` and the whole loaded model-states dict ``state``. Return the
    ``(missing_keys, unexpected_keys)`` of the load (the core applies ``strict`` to them) or
    None to let the core call ``engine.module.load_state_dict`` (an error when ``state_dict``
    is None).
    """


@hookspec(firstresult=True)
def deepspeed_load_optimizer_state(engine: Engine, checkpoint_dir: str, tag: str,
                                   state: Dict[str, Any]) -> Optional[bool]:
    """Restore the optimizer state yourself instead of the core (first result wins).

    Called on every rank by ``load_checkpoint`` when optimizer states are to be loaded (not with
    ``load_optimizer_states=False`` or ``load_module_only=True``). ``state`` is the loaded
    model-states dict. Return True when the plugin restored the optimizer (from its own files in
    ``checkpoint_dir``); None lets the core call ``engine.optimizer.load_state_dict``.
    """


@hookspec
def deepspeed_load_checkpoint(engine: Engine, load_dir: str, tag: str, checkpoint_dir: str,
                              state: Dict[str, Any], load_optimizer_states: bool,
                              load_lr_scheduler_states: bool, load_module_only: bool) -> None:
    """React to a loaded checkpoint (reset what the loaded state invalidates, read the entries
    ``deepspeed_save_checkpoint`` added); ``Stateful`` objects are restored already.

    Called on every rank at the end of ``load_checkpoint``, after the core restored the module
    and (unless ``load_module_only``) the optimizer, scheduler, counters, RNG and the plugins'
    ``deepspeed_stateful`` objects. ``state`` is the loaded model-states dict (read your entries
    from it); the flags are the caller's. Return value ignored.
    """


@hookspec(firstresult=True)
def deepspeed_consolidated_16bit_state_dict(engine: Engine, exclude_frozen_parameters: bool
                                            ) -> Optional[Dict[str, Optional[Dict[str, Any]]]]:
    """Build the module's full state dict from shards (first result wins), for plugins whose
    module holds only shards (ZeRO-3). Collective. Return ``{"state_dict": dict or None}``:
    the dict on global rank 0, None on the other ranks; return None itself to let the core
    use ``engine.module.state_dict()``."""


@hookspec(firstresult=True)
def deepspeed_save_16bit_model(engine: Engine, save_dir: str, save_filename: str,
                               exclude_frozen_parameters: bool) -> Optional[bool]:
    """Save the 16-bit weights yourself (first result wins), for plugins whose module holds
    only shards (ZeRO-3).

    Called on every rank by ``save_16bit_model``. Return True when the plugin wrote
    ``save_dir/save_filename`` (gathered, full shapes, with
    ``deepspeed.checkpoint.atomic_torch_save``), False when it decided not to save (e.g.
    ``stage3_gather_16bit_weights_on_model_save`` is off); None lets the core save
    ``engine.module.state_dict()`` from global rank 0.
    """


# ---------------------------------------------------------------------------------------------
# Parallel dimensions (see ``deepspeed.topology``) and launcher flags
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParallelDim:
    """A parallel dimension a plugin adds to an engine's topology (``deepspeed_parallel_dims``)
    or to the process's (``deepspeed.topology.current().add(...)``): every group of the
    dimension, as lists of global ranks. A rank appears in at most one list; a rank in none
    has no group along this dimension. Each group's ranks are numbered in ascending order of
    their global ranks (as ``torch.distributed`` numbers them). Adding one is collective: every
    rank adds the same dimension, in the same order relative to other collectives.

    ``name`` is the plugin's own (``"expert"``, ``"pipe.model"``): ``"data"`` and ``"model"``
    are reserved for the model-parallel unit the engine was given. ``key`` tells apart the
    instances of a dimension that exists several times at once (one expert dimension per
    expert-parallel size). ``basis`` records what the layout was derived from (e.g. the unit
    whose data-parallel groups it splits), for the owner to compare before reusing it."""

    name: str
    rank_lists: Tuple[Tuple[int, ...], ...]
    key: Optional[str] = None
    basis: Any = None


@dataclass(frozen=True)
class ParallelMesh:
    """Several dense dimensions at once: the world laid out as a grid of ``sizes`` (whose
    product is the world size), ranks numbered row-major (the last axis varies fastest), as a
    ``torch.distributed.device_mesh.DeviceMesh`` with ``axes`` as its dimension names. Each
    axis becomes the dimension ``"<name>.<axis>"``, and the axis named like the mesh the
    dimension ``name`` itself: ``ParallelMesh("tensor", ("data", "tensor"), (2, 2))`` gives
    ``"tensor"`` (ranks [0, 1], [2, 3]) and ``"tensor.data"`` ([0, 2], [1, 3])."""

    name: str
    axes: Tuple[str, ...]
    sizes: Tuple[int, ...]


@hookspec
def deepspeed_parallel_dims(engine: Engine,
                            config: DeepSpeedConfig) -> Optional[Iterable[Union[ParallelDim, ParallelMesh]]]:
    """Return the parallel dimensions this plugin adds to ``engine.topology``: an iterable of
    ``ParallelDim`` / ``ParallelMesh`` (or None). Called by enabled plugins in the engine's
    constructor, after the model-parallel unit is settled (``deepspeed_model_parallel_unit``)
    and before ``deepspeed_engine_init``; every rank adds them in plugin order, so their groups
    are built collectively. The engine's topology already holds every dimension built before
    it existed (``deepspeed.topology.current()`` then: tensor-parallel groups of
    ``tp_model_init``, expert groups of MoE layers, a pipeline's grid), and answers the
    ``"data"`` / ``"model"`` dimensions from the engine's unit. Afterwards a plugin reads its
    groups with ``engine.topology.group(name, key)``, ``.ranks(...)``, ``.size(...)``."""


@hookspec
def deepspeed_launcher_arguments(parser: argparse.ArgumentParser) -> Optional[Iterable[str]]:
    """Add the ``deepspeed`` command's flags your plugin owns to ``parser`` (an
    ``argparse.ArgumentParser``; ``--autotuning``, ``--elastic_training``). Asked of every
    *installed* plugin by the runner before it parses the command line (the launcher names no
    feature); the runner then hands a command line using one of them to
    ``deepspeed_launcher_command``. Return the ``dest`` names of the flags you added, so the
    runner knows which parsed values are yours."""


# ---------------------------------------------------------------------------------------------
# Protocols: the objects that cross the boundary
# ---------------------------------------------------------------------------------------------
#: The phases ``engine.timers`` measures around every step, in this order (monitors and the
#: progress report log them; a plugin may time more under its own names).
STEP_TIMERS = ("forward", "backward", "backward_inner", "backward_allreduce", "step")


@runtime_checkable
class Engine(Protocol):
    """What a plugin may use of the ``engine`` every hook receives: each member a plugin reads,
    writes, calls or (in an engine subclass) overrides, and nothing private. The boundary test
    (``tests/core/test_plugin_boundary.py``) fails a plugin that touches any other engine member
    or probes the engine with ``getattr`` / ``hasattr``. ``DeepSpeedEngine`` and its subclasses
    implement it; every member exists from ``deepspeed_engine_init`` on (the optimizer ones are
    None until it has returned; ``deepspeed_model_parallel_unit``, asked earlier, may use
    ``module``, ``config`` and ``mpu``). A plugin that provides an engine subclass through
    ``deepspeed_engine_for_model`` may also use what that subclass adds, in its own package.
    Features a plugin adds to the engine for its users go through
    ``deepspeed_engine_attributes``, never onto the engine directly."""

    # ---- what is trained
    module: torch.nn.Module  # the client model (a plugin may split or wrap it in engine_init)
    config: DeepSpeedConfig  # the validated config; ``config.section(key)`` reads a section
    device: torch.device  # where the module, its inputs and the engine's buffers live
    # ---- the plugins taking part
    hook: pluggy.HookRelay  # the enabled plugins' hooks, for an engine subclass's own step
    plugins: pluggy.PluginManager  # the enabled plugins (``plugins.has_plugin("pipe")``)
    # ---- parallelism
    # the one owner of this engine's process groups: ``topology.group("data")``, ``.size(name)``,
    # ``.ranks(name, key)``; plugins add dimensions through ``deepspeed_parallel_dims``
    topology: Topology
    mpu: Any  # the model-parallel unit (``get_data_parallel_group()`` ...) or None
    dp_group: Any  # the data-parallel process group gradients are averaged over
    dp_world_size: int  # ranks in ``dp_group``
    # ---- counters and instruments
    global_steps: int  # optimizer steps taken (skipped fp16 overflow steps included)
    global_samples: int  # samples trained on, summed over the data-parallel ranks
    timers: EngineTimers  # named timers around the step's phases (and a plugin's own)
    monitor: Optional[Monitor]  # the enabled monitor's writer (``deepspeed_engine_monitor``)
    sharding: Sharding  # how a plugin shards the training state (``deepspeed_sharding``)
    training_dataloader: Optional[Iterable[Any]]  # ``initialize(training_data=...)``'s loader
    # ---- optimizer and precision
    basic_optimizer: Optional[torch.optim.Optimizer]  # the torch optimizer the policy steps
    optimizer: Any  # what the user gets back: ``basic_optimizer`` or a plugin's wrapper of it
    precision: PrecisionPolicy  # the precision policy the step drives (``loss_scale`` ...)
    lr_scheduler: Any  # the LR scheduler stepping ``basic_optimizer``, or None
    # upstream's flag, read by users: False while the 1-bit optimizers exchange compressed
    # momenta instead of all-reducing gradients (whether the core reduces is decided by
    # ``deepspeed_reduce_gradients``)
    enable_backward_allreduce: bool

    # ---- the step: the user's calls, which an engine subclass may close or drive itself
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module through the forward hooks."""

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Back-propagate ``loss``; reduce gradients at the accumulation boundary."""

    def step(self, **kwargs: Any) -> None:
        """At the accumulation boundary: unscale, clip, step the optimizer and scheduler."""

    def destroy(self) -> None:
        """Undo everything the engine registered process-wide (hooks, patches, topology): a
        plugin that builds engines of its own (``deepspeed.plan.measure`` measuring real runs)
        ends them with it."""

    def allreduce_gradients(self) -> None:
        """The core's data-parallel gradient average (what no ``deepspeed_reduce_gradients``
        implementation took over)."""

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether this micro-step reduces gradients and steps the optimizer."""

    def gradient_norm_group(self) -> Any:
        """The ranks holding the model's other parameters (model-parallel or pipeline peers)
        whose gradients the global norm sums too when clipping, or None: a template method an
        engine subclass overrides."""

    def progress_report(self) -> str:
        """The line logged every ``steps_per_print`` steps: a template method an engine
        subclass overrides to report its own quantities."""

    # ---- the batch triangle and upstream's queries
    def train_batch_size(self) -> int: ...

    def train_micro_batch_size_per_gpu(self) -> int: ...

    def gradient_accumulation_steps(self) -> int: ...

    def zero_optimization_stage(self) -> int: ...

    def fp16_enabled(self) -> bool: ...

    def get_lr(self) -> List[float]:
        """The learning rate of each of the optimizer's param groups."""

    def load_checkpoint(self, load_dir: str, **kwargs: Any) -> Any:
        """``deepspeed.checkpoint.load_checkpoint`` on this engine (an engine subclass may
        refuse options)."""


@runtime_checkable
class PrecisionPolicy(Protocol):
    """What ``DeepSpeedEngine`` drives each step; ``deepspeed.precision`` provides the fp32 /
    bf16 / fp16 policies and a plugin whose ``deepspeed_wrap_optimizer`` returns a replacement
    implements it over its own storage (ZeRO over partitions). Called in the order of the
    methods below, the last six only at an accumulation boundary."""

    loss_scale: float  # the current fp16 loss scale (1.0 when losses are not scaled)

    def scale_loss(self, loss) -> Any:
        """The tensor to back-propagate (``loss`` times the loss scale)."""

    def accumulate_micro_grads(self) -> None:
        """After each backward: fold this micro-batch's gradients into the accumulator."""

    def reduction_grads(self) -> List[Any]:
        """The gradient tensors the core all-reduces in place when no plugin reduces them."""

    def unscale_grads(self) -> bool:
        """Unscale and check for fp16 overflow; False skips this step."""

    def clip_grad_norm(self, max_norm: float, norm_group=None) -> float:
        """Clip to ``max_norm``; return the global norm measured before clipping. With
        ``norm_group`` (the ranks holding the model's other parameters: pipeline stages) the
        norm is over all of them, parameters marked ``REPLICATED_PARAM`` counted once."""

    def optimizer_step(self) -> None:
        """Step the basic optimizer."""

    def after_optimizer_step(self) -> None:
        """Copy the updated masters back into the model's weights."""

    def update_scale(self, overflow: bool) -> None:
        """Adjust the loss scale after a step (skipped when ``overflow``)."""

    def zero_grad(self) -> None:
        """Clear every gradient the step consumed."""

    def master_params(self) -> List[Any]:
        """The tensors the basic optimizer steps (fp32 masters or partitions)."""

    def model_param_of(self, stepped) -> Optional[Any]:
        """The model parameter that the optimizer tensor ``stepped`` stands for whole (itself
        in fp32 training, its 16-bit parameter for an fp32 master), or None when ``stepped``
        is not one parameter (a flat partition): universal checkpoints load through it."""


@runtime_checkable
class Stateful(Protocol):
    """An object whose state a checkpoint carries (torch's ``Stateful``; see
    ``deepspeed_stateful``): its state is a dict of tensors and plain Python values."""

    def state_dict(self) -> Dict[str, Any]: ...

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None: ...


class StepTimer(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


@runtime_checkable
class EngineTimers(Protocol):
    """``engine.timers``: named wall-clock timers, real with ``wall_clock_breakdown`` and
    no-ops otherwise. Plugins time their own phases with it (``engine.timers("name")``) and
    monitors read the last step's phases with ``last_ms``."""

    def __call__(self, name: str) -> StepTimer: ...

    def names(self) -> List[str]:
        """Every timer used so far, ``STEP_TIMERS`` ones included."""

    def last_ms(self, name: str) -> Optional[float]:
        """Milliseconds the timer ``name`` measured in its last start/stop, None if never."""

    def log(self, names: Sequence[str]) -> None:
        """Print the named timers' elapsed times on rank 0."""


@runtime_checkable
class Monitor(Protocol):
    """What ``engine.monitor`` is (see ``deepspeed_engine_monitor``)."""

    def write_events(self, events: Iterable[Tuple[str, float, int]]) -> None: ...


@runtime_checkable
class CommsLogger(Protocol):
    """A comm observer that can summarise (see ``deepspeed_comms_logger``): called with each
    ``deepspeed.comm.CommRecord``; ``log_summary`` answers ``deepspeed.comm.log_summary``."""

    def __call__(self, record) -> None: ...

    def log_summary(self, show_straggler: bool = False, return_dict: bool = False) -> Any: ...


#: Set true on a parameter whose identical copy on another rank of the ``norm_group`` is the
#: one counted in the global gradient norm (a tied weight on all but the lowest pipeline stage;
#: upstream's name).
REPLICATED_PARAM = "ds_pipe_replicated"


#: Set (to a process group) on a parameter whose gradient is summed over that group instead of
#: the engine's data-parallel group: an expert's weights, summed over the ranks holding the same
#: expert (``deepspeed.moe``). The average still divides by the data-parallel world size, since
#: such a gradient already sums what the tokens of other ranks contributed to it. A sharding
#: plugin (ZeRO 1/2) partitions such a parameter's training state over that group, so all
#: parameters of one optimizer param group must declare the same group (or none).
GRADIENT_GROUP = "ds_gradient_group"

#: Set (to a process group) next to ``GRADIENT_GROUP`` on a parameter that the ranks of *this*
#: group hold different copies of (each rank its own experts: the expert-parallel group), so
#: the global gradient norm sums its squares over that group; the ranks of its
#: ``GRADIENT_GROUP`` hold identical copies after reduction and count it once each. Without it
#: a parameter's gradient is the same on every data-parallel rank and counted locally.
GRADIENT_NORM_GROUP = "ds_gradient_norm_group"


#: Set (to a str) on a parameter whose name in a universal checkpoint (``ds_to_universal``: one
#: tensor per parameter, independent of how the model is split over ranks) must be declared: an
#: MoE expert that a rank holds under a local index is stored under the index it has in the model
#: holding every expert (``deepspeed.moe``); every parameter of a pipeline stage declares its
#: global name (``deepspeed.pipe``), since the stage holds only some of the model. A parameter
#: group may then hold only part of the checkpoint's group (this rank's experts, this stage's
#: layers). Universal loaders read tensors by this name.
UNIVERSAL_CHECKPOINT_NAME = "ds_universal_checkpoint_name"

#: Set (to ``(dim, parts, index)``) on a parameter that this rank holds one piece of: the whole
#: tensor cut along ``dim`` into ``parts`` pieces, the first ``size % parts`` of them one row
#: longer, of which this is piece ``index`` (a tensor-parallel slice). Saving records it per
#: parameter name (``param_slices`` in the model-states file), so ``ds_to_universal`` can join
#: the pieces into the whole tensor a universal checkpoint stores; universal loaders cut this
#: rank's piece out of the whole tensor again, so a checkpoint saved at one split loads at any.
UNIVERSAL_CHECKPOINT_SLICE = "ds_universal_checkpoint_slice"


#: The attribute through which a plugin that partitions a parameter's training state answers
#: ``deepspeed.utils.safe_get_*`` / ``safe_set_*`` for it (a ``ParamStateAccess``); a
#: parameter without it is held whole and plainly by its module and its torch optimizer.
PARAM_STATE_ACCESS = "ds_state_access"


@runtime_checkable
class ParamStateAccess(Protocol):
    """Reads and writes one parameter's share of partitioned training state. ``full`` methods
    are collectives over the data-parallel group and use the parameter's full shape; ``local``
    ones return or take this rank's fragment as a 1-D tensor. ``optim_state_key`` None means
    the fp32 master weight, else a per-element optimizer state (``"exp_avg"``); an accessor
    that holds no optimizer state raises ``ValueError`` naming why for a key."""

    def get_full_hp_param(self, param, optim_state_key: Optional[str] = None) -> Any: ...

    def get_local_hp_param(self, param, optim_state_key: Optional[str] = None) -> Any: ...

    def get_full_hp_grad(self, param) -> Any: ...

    def get_local_hp_grad(self, param) -> Any: ...

    def set_full_hp_param(self, value, param, optim_state_key: Optional[str] = None) -> None: ...

    def set_local_hp_param(self, value, param, optim_state_key: Optional[str] = None) -> None: ...

    def set_full_hp_grad(self, value, param) -> None:
        """Replace the gradient the next step uses (where ``get_full_hp_grad`` reads it)."""

    def set_local_hp_grad(self, value, param) -> None:
        """Replace this rank's fragment of that gradient."""


def protocol_members(protocol) -> List[str]:
    """The public members ``protocol`` declares: its methods and its annotated attributes."""
    names = {name for name in dir(protocol) if not name.startswith("_")}
    for klass in protocol.__mro__:
        names |= {name for name in vars(klass).get("__annotations__", {})
                  if not name.startswith("_")}
    return sorted(names)


def check_implements(obj, protocol, source):
    """Raise ``TypeError`` naming what ``obj`` (returned by ``source``, e.g. a hook) lacks of
    ``protocol``, so a plugin author learns it at ``initialize``, not mid-step."""
    missing = [name for name in protocol_members(protocol) if not hasattr(obj, name)]
    if missing:
        raise TypeError(f"{source} returned a {type(obj).__name__}, which does not implement "
                        f"deepspeed.hooks.{protocol.__name__}: missing {', '.join(missing)}")
    return obj


__all__ = [name for name in dict(globals()) if name.startswith("deepspeed_")] + [
    "hookspec", "hookimpl", "PROJECT_NAME", "EngineChoice", "Sharding", "NOT_SHARDED",
    "STEP_TIMERS", "Engine", "Stateful", "PrecisionPolicy", "StepTimer", "EngineTimers", "Monitor",
    "CommsLogger",
    "PARAM_STATE_ACCESS", "ParamStateAccess", "REPLICATED_PARAM", "GRADIENT_GROUP",
    "ParallelDim", "ParallelMesh",
    "GRADIENT_NORM_GROUP", "UNIVERSAL_CHECKPOINT_NAME", "UNIVERSAL_CHECKPOINT_SLICE",
    "protocol_members", "check_implements"]
