"""`DeepSpeedConfig`: the validated, resolved config one engine runs with.

It joins the pieces of this package: load the source, validate core and plugin sections, resolve
the batch triangle for the data-parallel world size, and answer upstream's attribute names
(`fp16_enabled`, `optimizer_name`, ...: `UPSTREAM_ATTRIBUTES`) that integrations read.
"""
import os
from types import SimpleNamespace
from typing import Any, Dict, Mapping, Optional

from deepspeed.config.batch import resolve_batch_triangle
from deepspeed.config.core_sections import CoreConfig
from deepspeed.config.errors import DeepSpeedConfigError
from deepspeed.config.feature_sections import FEATURE_SECTIONS
from deepspeed.config.loader import BASE64_SOURCE_NAME, describe_source, load_config_source
from deepspeed.config.model import flatten, plain_value
from deepspeed.config.validation import check_sections, validate_config


def _initialised_world_size() -> Optional[int]:
    """The default process group's size when one is up, else None. Asked of
    ``torch.distributed`` itself: ``deepspeed.comm`` sits above this package (its settings
    are config models), and the config can be built before, or without, a process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return None


def resolve_world_size(world_size: Optional[int], mpu=None) -> int:
    """The data-parallel world size the batch triangle is solved for.

    A sequence-parallel mpu (Ulysses/ALST: ``get_sequence_parallel_world_size`` and
    ``get_sequence_data_parallel_world_size``) averages gradients over every rank, but a
    sequence-parallel group shares one sample, so the batch counts ``world / sp`` replicas
    (what Accelerate sets ``train_batch_size`` from)."""
    if world_size is not None:
        return world_size
    if mpu is not None and hasattr(mpu, "get_sequence_parallel_world_size") \
            and hasattr(mpu, "get_sequence_data_parallel_world_size"):
        return (mpu.get_sequence_data_parallel_world_size()
                // mpu.get_sequence_parallel_world_size())
    if mpu is not None:
        return mpu.get_data_parallel_world_size()
    world = _initialised_world_size()
    if world is not None:
        return world
    env = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(env)
    except ValueError:
        raise DeepSpeedConfigError(f"environment variable WORLD_SIZE={env!r} is not an integer") from None


def installed_sections() -> Dict[str, Any]:
    """The config sections every installed plugin contributes (``deepspeed.plugins`` entry
    points), for a ``DeepSpeedConfig`` built outside ``deepspeed.initialize``."""
    from deepspeed.plugin_manager import PluginCatalog

    return PluginCatalog().sections


MONITOR_SECTIONS = ("tensorboard", "wandb", "csv_monitor", "comet")

# Upstream's ``DeepSpeedConfig`` attributes that are plain core values -> the core field (dotted)
# that holds each. Integrations and user code read these names on ``engine.config``; anything not
# listed is read as ``config.core.<field>``.
UPSTREAM_ATTRIBUTES = {
    "fp16_enabled": "fp16.enabled",
    "fp16_auto_cast": "fp16.auto_cast",
    "fp16_master_weights_and_grads": "fp16.fp16_master_weights_and_grads",
    "loss_scale": "fp16.loss_scale",
    "bfloat16_enabled": "bf16.enabled",
    "bfloat16_immediate_grad_update": "bf16.immediate_grad_update",
    "amp_enabled": "amp.enabled",
    "communication_data_type": "communication_data_type",
    "grad_accum_dtype": "data_types.grad_accum_dtype",
    "gradient_clipping": "gradient_clipping",
    "prescale_gradients": "prescale_gradients",
    "gradient_predivide_factor": "gradient_predivide_factor",
    "sparse_gradients_enabled": "sparse_gradients",
    "steps_per_print": "steps_per_print",
    "wall_clock_breakdown": "wall_clock_breakdown",
    "memory_breakdown": "memory_breakdown",
    "dump_state": "dump_state",
    "dataloader_drop_last": "dataloader_drop_last",
    "load_universal_checkpoint": "checkpoint.load_universal",
    "use_node_local_storage": "checkpoint.use_node_local_storage",
    "checkpoint_parallel_write_pipeline": "checkpoint.parallel_write.pipeline_stage",
    "activation_checkpointing_config": "activation_checkpointing",
}


class MonitorSections:
    """The monitor sections of a config as attributes (``DeepSpeedConfig.monitor_config``)."""

    def __init__(self, sections: Dict[str, Any]):
        self.__dict__.update(sections)
        self._keys = tuple(sections)

    @property
    def enabled(self) -> bool:
        """Whether any monitor section is switched on."""
        return any(bool(getattr(getattr(self, key), "enabled", False)) for key in self._keys)

    def __repr__(self):
        return f"MonitorSections({', '.join(f'{k}={getattr(self, k)!r}' for k in self._keys)})"


def _section_default(section_type):
    """The validated value of a section written as ``{}``."""
    from pydantic import BaseModel, TypeAdapter, ValidationError

    try:
        if isinstance(section_type, type) and issubclass(section_type, BaseModel):
            return section_type.model_validate({})
        return TypeAdapter(section_type).validate_python({})
    except ValidationError as exc:
        raise ValueError(str(exc)) from None


class DeepSpeedConfig:
    """A user config, validated against the core keys plus the plugin `sections`
    (default: those of every installed plugin, as ``deepspeed.initialize`` uses; ``{}``
    validates the core keys alone)."""

    def __init__(self, config: Any, mpu=None, *, sections: Optional[Mapping[str, Any]] = None,
                 world_size: Optional[int] = None, catalog=None):
        # ``catalog`` (a ``PluginCatalog``): its plugins may decide the batch sizes
        # (``deepspeed_batch_size``: elastic training); without sections, the installed one
        if sections is None:
            if catalog is None:
                from deepspeed.plugin_manager import PluginCatalog

                catalog = PluginCatalog()
            sections = catalog.sections
        self.source: Optional[str] = describe_source(config)
        self.raw: Dict[str, Any] = load_config_source(config)
        if self.source is None and isinstance(config, str):
            self.source = BASE64_SOURCE_NAME
        self._section_types = check_sections(sections)
        self.core, self._plugins = validate_config(load_config_source(self.raw),
                                                   self._section_types, self.source)
        self.world_size = resolve_world_size(world_size, mpu)
        batch = (self.core.train_batch_size, self.core.train_micro_batch_size_per_gpu,
                 self.core.gradient_accumulation_steps)
        if catalog is not None:
            batch = catalog.installed_hook.deepspeed_batch_size(
                config=self.raw, world_size=self.world_size) or batch
        try:
            resolved = resolve_batch_triangle(*batch, self.world_size)
        except DeepSpeedConfigError as exc:
            raise DeepSpeedConfigError(exc.problems, source=self.source) from None
        (self.train_batch_size, self.train_micro_batch_size_per_gpu,
         self.gradient_accumulation_steps) = resolved

    # -- sections ---------------------------------------------------------------------------
    def _core_field_name(self, key: str) -> Optional[str]:
        name = CoreConfig.input_keys().get(key)
        if name is None and key in CoreConfig.deprecated_aliases():
            name = CoreConfig.deprecated_aliases()[key][0]
        return name

    def section(self, key: str):
        """The validated model of a core or plugin section, or None if the user omitted it."""
        if key in self._section_types:
            return self._plugins.get(key)
        name = self._core_field_name(key)
        if name is not None:
            return getattr(self.core, name) if name in self.core.model_fields_set else None
        if key in FEATURE_SECTIONS:
            return None
        raise KeyError(f"'{key}' is neither a core config key nor a section of an installed plugin")

    def has_section(self, key: str) -> bool:
        if key in self._section_types:
            return key in self._plugins
        name = self._core_field_name(key)
        return name is not None and name in self.core.model_fields_set

    # -- the dict face integrations read (HF Trainer: ``engine.config.get(...)``) -------------
    def get(self, key: str, default: Any = None) -> Any:
        """The user's value of top-level ``key`` as written (HF reads the engine's config as
        the dict it passed)."""
        return self.raw.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __contains__(self, key: str) -> bool:
        return key in self.raw

    # -- output -----------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """The resolved config: defaults filled in, batch triangle solved, old names renamed."""
        resolved = self.core.to_dict()
        resolved["train_batch_size"] = self.train_batch_size
        resolved["train_micro_batch_size_per_gpu"] = self.train_micro_batch_size_per_gpu
        resolved["gradient_accumulation_steps"] = self.gradient_accumulation_steps
        for key, value in self._plugins.items():
            resolved[key] = plain_value(value)
        return resolved

    def default_dict(self) -> Dict[str, Any]:
        """What ``to_dict`` would hold for a config that sets nothing: the core defaults, and
        for each section given, that section's own defaults (empty when it has required keys)."""
        defaults = CoreConfig().to_dict()
        defaults["gradient_accumulation_steps"] = 1  # what the batch triangle resolves by default
        for key in self._plugins:
            try:
                defaults[key] = plain_value(_section_default(self._section_types[key]))
            except ValueError:  # a section with required keys has no default to compare to
                defaults[key] = {}
        return defaults

    def print(self, name: str = "DeepSpeedEngine", full: Optional[bool] = None) -> None:
        """Log the resolved config once, on rank 0, as `  key ....... value` lines.

        By default only the keys whose value differs from its default are listed (a section
        given with nothing changed shows as ``(defaults)``), so the dump says what this run
        changed; ``full`` (default: ``dump_state: true`` or the DEBUG log level) lists every
        key."""
        import logging

        from deepspeed.utils.logging import log_dist, logger

        if full is None:
            full = bool(self.core.dump_state) or logger.isEnabledFor(logging.DEBUG)
        resolved = self.to_dict()
        items = sorted(flatten(resolved))
        if full:
            title = f"{name} configuration:"
        else:
            defaults = dict(flatten(self.default_dict()))
            items = [(key, value) for key, value in items
                     if key not in defaults or defaults[key] != value]
            shown = {key.split(".")[0] for key, _ in items}
            items += [(key, "(defaults)") for key in self._plugins if key not in shown]
            items.sort()
            title = (f"{name} configuration (keys that differ from their defaults; all keys "
                     f"with dump_state: true or DS_LOG_LEVEL=debug):")
        lines = [title]
        width = max((len(key) for key, _ in items), default=0) + 3
        for key, value in items:
            lines.append(f"  {key} {'.' * (width - len(key))} {value}")
        log_dist("\n".join(lines), ranks=[0])

    def __repr__(self):
        where = f" from {self.source}" if self.source else ""
        return (f"DeepSpeedConfig({where.strip() or 'dict'}: train_batch_size={self.train_batch_size}, "
                f"micro={self.train_micro_batch_size_per_gpu}, gas={self.gradient_accumulation_steps}, "
                f"sections={sorted(self._plugins)})")

    # -- upstream's attribute names ---------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        """Upstream's plain-value attributes (``fp16_enabled``, ``gradient_clipping``, ...), read
        from the core section through ``UPSTREAM_ATTRIBUTES``; other values: ``config.core``."""
        path = UPSTREAM_ATTRIBUTES.get(name)
        if path is None or "core" not in self.__dict__:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        value = self.core
        for part in path.split("."):
            value = getattr(value, part)
        return value

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(UPSTREAM_ATTRIBUTES))

    # upstream's attributes that are computed from the core values
    @property
    def initial_dynamic_scale(self) -> float:
        return float(2 ** self.core.fp16.initial_scale_power)

    @property
    def dynamic_loss_scale_args(self) -> Dict[str, Any]:
        fp16 = self.core.fp16
        return {"init_scale": self.initial_dynamic_scale, "scale_window": fp16.loss_scale_window,
                "delayed_shift": fp16.hysteresis, "consecutive_hysteresis": fp16.consecutive_hysteresis,
                "min_scale": fp16.min_loss_scale}

    @property
    def amp_params(self) -> Dict[str, Any]:
        return self.core.amp.apex_params()

    @property
    def optimizer_name(self) -> Optional[str]:
        """The `optimizer.type` exactly as written (case is the optimizer factory's business)."""
        return self.core.optimizer.type if self.core.optimizer is not None else None

    @property
    def optimizer_params(self) -> Optional[Dict[str, Any]]:
        return dict(self.core.optimizer.params) if self.core.optimizer is not None else None

    @property
    def scheduler_name(self) -> Optional[str]:
        return self.core.scheduler.type if self.core.scheduler is not None else None

    @property
    def scheduler_params(self) -> Optional[Dict[str, Any]]:
        return dict(self.core.scheduler.params) if self.core.scheduler is not None else None

    @property
    def monitor_config(self) -> "MonitorSections":
        """Upstream's monitor settings object: ``.tensorboard``, ``.wandb``, ``.csv_monitor``,
        ``.comet`` (each the validated section, its defaults when the config omits it) and
        ``.enabled``; ``MonitorMaster(ds_config.monitor_config)`` as the Monitor tutorial
        writes it."""
        return MonitorSections({key: self._section_or_default(key) for key in MONITOR_SECTIONS})

    def _section_or_default(self, key: str) -> Any:
        """A plugin's section model as validated, or its defaults when the config omits it;
        the raw section (attribute access) when no installed plugin owns the key."""
        if key in self._section_types:
            found = self._plugins.get(key)
            return found if found is not None else self._section_types[key]()
        return SimpleNamespace(**(self.raw.get(key) or {}))

    # -- checkpoints ------------------------------------------------------------------------
    @property
    def checkpoint_tag_validation_enabled(self) -> bool:
        return self.core.checkpoint.tag_validation != "Ignore"

    @property
    def checkpoint_tag_validation_fail(self) -> bool:
        return self.core.checkpoint.tag_validation == "Fail"
