"""Plugin discovery and the per-engine plugin manager.

Every feature (built-in or third-party) is a plugin found through the entry-point group
``deepspeed.plugins``; nothing is registered by hand. An entry point names either

- a class (usually a ``DeepSpeedPlugin`` subclass): one fresh instance per engine, so plugin
  state never leaks between two engines in one process; or
- a module or other object with ``@deepspeed.hookimpl`` functions: shared, hence stateless.

Each engine gets its own ``pluggy.PluginManager`` holding only the plugins its config enables,
so hooks of a disabled plugin never run. Plugins state what they ``requires`` and ``excludes``
(other plugin names enabled together, or never together); conflicts are errors at
``deepspeed.initialize`` naming both plugins. A plugin that imports another one's package API
(Domino builds on ``deepspeed.tensor_parallel``) says so in ``depends_on``: the catalog refuses
to load it, naming both, when that plugin is not installed, whatever the config enables.
"""
import functools
import inspect
from dataclasses import dataclass
from importlib import metadata

import pluggy

from deepspeed import hooks
from deepspeed.utils.entry_points import distribution_of, entry_points_of, rescanned_on_install

ENTRY_POINT_GROUP = "deepspeed.plugins"


class PluginError(RuntimeError):
    """A plugin failed to load, or the enabled plugins conflict."""


class DeepSpeedPlugin:
    """Convenience base for plugin classes; plain modules with hookimpls work too.

    Subclasses set ``config_sections`` (key -> ``DeepSpeedConfigModel``), optionally
    ``requires`` / ``excludes`` (plugin names that must / must not be enabled as well),
    ``depends_on`` (plugins whose package API this one imports: they must be installed) and
    override ``is_enabled`` when presence of the section is not the right switch (e.g. ZeRO is
    off at ``stage: 0``), saying so in ``enabled_by`` for ``ds_report``.
    """

    config_sections = {}
    # for sections that are plain values, not models (``"sequence_parallel_size": int``): the
    # test that fails when the key stops working, {section key: "tests/<file>.py::<test>"};
    # model sections say it in their own ``tested_by`` (see deepspeed.config.model)
    tested_by = {}
    enabled_by = None
    requires = ()
    excludes = ()
    depends_on = ()

    @hooks.hookimpl
    def deepspeed_config_sections(self):
        return dict(self.config_sections)

    def is_enabled(self, config, sections):
        """Whether ``config`` (a ``DeepSpeedConfig``) turns this plugin on. ``sections`` are the
        keys this plugin owns."""
        return default_is_enabled(config, sections)


def default_is_enabled(config, sections):
    """Enabled when an owned section is present and not switched off by ``enabled: false``."""
    for key in sections:
        if config.has_section(key):
            section = config.section(key)
            if getattr(section, "enabled", True):
                return True
    return False


@dataclass(frozen=True)
class PluginSpec:
    """An installed plugin as its entry point describes it."""

    name: str
    value: str  # "module:attr" as written in the entry point
    distribution: str
    version: str

    def load(self):
        try:
            return _load_entry_point(self.name, self.value)
        except Exception as exc:
            raise PluginError(
                f"plugin '{self.name}' ({self.value}) from distribution '{self.distribution}' "
                f"failed to load: {type(exc).__name__}: {exc}") from exc


@functools.lru_cache(maxsize=None)
def _load_entry_point(name, value):
    return metadata.EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP).load()


@rescanned_on_install
def installed_plugins():
    """``{name: PluginSpec}`` of every plugin installed in this environment, sorted by name.
    A third-party plugin registered under a built-in's name replaces the built-in. Read again
    only when what is installed may have changed (``scan_key``): parsing each plugin's
    distribution metadata was most of a ``deepspeed.initialize`` on a small model."""
    return {name: PluginSpec(name, ep.value, *distribution_of(ep))
            for name, ep in entry_points_of(ENTRY_POINT_GROUP).items()}


def _instantiate(obj):
    return obj() if inspect.isclass(obj) else obj


class _HookManager(pluggy.PluginManager):
    """pluggy's manager, reading a plugin class's hook implementations once per process: each
    engine registers fresh instances of every installed plugin (and again the enabled ones),
    and pluggy inspects every attribute of each (~14 ms of a small model's
    ``deepspeed.initialize``). A class's markers are fixed, so its answers are kept; a plugin
    that is a module, or an attribute set on an instance, is inspected every time."""

    _opts_of_class = {}  # (plugin class, attribute name) -> hookimpl options or None

    def parse_hookimpl_opts(self, plugin, name):
        if inspect.ismodule(plugin) or name in getattr(plugin, "__dict__", ()):
            return super().parse_hookimpl_opts(plugin, name)
        key = (type(plugin), name)
        if key not in self._opts_of_class:
            self._opts_of_class[key] = super().parse_hookimpl_opts(plugin, name)
        opts = self._opts_of_class[key]
        return None if opts is None else dict(opts)


def new_hook_manager():
    pm = _HookManager(hooks.PROJECT_NAME)
    pm.add_hookspecs(hooks)
    return pm


class PluginCatalog:
    """All installed plugins, instantiated once for one engine, with the sections each owns.

    Building the catalog is the step that must see every plugin (to know the whole config
    schema); ``enabled_manager`` then narrows it to the plugins the config switches on.
    """

    def __init__(self, specs=None):
        self.specs = installed_plugins() if specs is None else specs
        self._all = new_hook_manager()
        self.plugins = {}
        for name, spec in self.specs.items():
            plugin = _instantiate(spec.load())
            self._all.register(plugin, name=name)
            self.plugins[name] = plugin
        check_dependencies(self.plugins)
        self.owners = {}  # section key -> plugin name
        self.sections = {}  # section key -> config model
        for impl in self._all.hook.deepspeed_config_sections.get_hookimpls():
            for key, model in (impl.function() or {}).items():
                if key in self.owners:
                    raise PluginError(f"plugins '{self.owners[key]}' and '{impl.plugin_name}' "
                                      f"both claim the config section '{key}'")
                self.owners[key] = impl.plugin_name
                self.sections[key] = model

    @property
    def installed_hook(self):
        """The hooks of every installed plugin, enabled or not: only for the hooks documented
        as asked of installed plugins (``deepspeed_config_sections``,
        ``deepspeed_comms_logger``), which run before or without any engine."""
        return self._all.hook

    def engine_choice(self, model, config=None):
        """``(EngineChoice, plugin name)`` of the installed plugin that claims ``model``
        (``deepspeed_engine_for_model``, given the user's ``config`` as a plain dict), or
        ``(None, None)``."""
        offered = {"model": model, "config": {} if config is None else config}
        # pluggy's call order (last registered first), so the answer is the hook call's
        for impl in reversed(self._all.hook.deepspeed_engine_for_model.get_hookimpls()):
            choice = impl.function(**{name: offered[name] for name in impl.argnames})
            if choice is not None:
                return choice, impl.plugin_name
        return None, None

    def wanted_by(self, model):
        """Names of the installed plugins that ask to take part for ``model``
        (``deepspeed_enable_for_model``)."""
        return [impl.plugin_name
                for impl in self._all.hook.deepspeed_enable_for_model.get_hookimpls()
                if impl.function(model=model)]

    def sections_of(self, name):
        return [key for key, owner in self.owners.items() if owner == name]

    def switches_of(self, name):
        """What turns plugin ``name`` on, for ``ds_report``: its ``enabled_by`` text when it
        has one (a section it owns may only configure it), else its sections."""
        text = getattr(self.plugins.get(name), "enabled_by", None)
        return text or ", ".join(self.sections_of(name))

    def enabled_names(self, config):
        enabled = []
        for name, plugin in self.plugins.items():
            owned = self.sections_of(name)
            check = getattr(plugin, "is_enabled", None)
            on = check(config, owned) if callable(check) else default_is_enabled(config, owned)
            if on:
                enabled.append(name)
        return enabled

    def enabled_manager(self, config, also=()):
        """A fresh ``pluggy.PluginManager`` holding only the plugins ``config`` enables, and
        those named in ``also`` (the plugin whose engine drives the model)."""
        names = self.enabled_names(config)
        names += [name for name in also if name not in names]
        check_compatibility({n: self.plugins[n] for n in names})
        pm = new_hook_manager()
        for name in names:
            pm.register(self.plugins[name], name=name)
        return pm


def call_each_plugin(hook_caller, **kwargs):
    """``[(plugin name, answer)]`` of every implementation of a hook, for the hooks whose
    answers the core files under the answering plugin's name (``deepspeed_stateful``). Each
    implementation gets the subset of ``kwargs`` it accepts, as pluggy passes them; the order
    is pluggy's call order."""
    return [(impl.plugin_name, impl.function(*[kwargs[name] for name in impl.argnames]))
            for impl in reversed(hook_caller.get_hookimpls())]


def check_dependencies(installed):
    """Raise ``PluginError`` naming both plugins when one imports the package of a plugin that
    is not installed (``depends_on``)."""
    for name, plugin in installed.items():
        for needed in getattr(plugin, "depends_on", ()):
            if needed not in installed:
                raise PluginError(f"plugin '{name}' depends on plugin '{needed}' (it uses that "
                                  f"plugin's package), which is not installed (installed: "
                                  f"{sorted(installed)})")


def check_compatibility(enabled):
    """Raise ``PluginError`` naming both plugins when a requirement is missing or an excluded
    plugin is enabled as well."""
    for name, plugin in enabled.items():
        for needed in getattr(plugin, "requires", ()):
            if needed not in enabled:
                raise PluginError(f"plugin '{name}' requires plugin '{needed}', which is not "
                                  f"enabled by the config (enabled: {sorted(enabled) or 'none'})")
        for banned in getattr(plugin, "excludes", ()):
            if banned in enabled:
                raise PluginError(f"plugin '{name}' cannot be used together with plugin "
                                  f"'{banned}'; disable one of them in the config")
