"""Hook fixtures for plugin authors' unit tests.

``engine_stand_in(**plugins)`` is the least an engine offers to code that only calls hooks
(``engine.hook.deepspeed_<name>(...)``): the given plugin objects registered under the given
names, as the engine's plugin manager would hold them, so a plugin's hooks and the core
functions driving them can be tested without building an engine.
"""
from types import SimpleNamespace

from deepspeed.plugin_manager import new_hook_manager


def engine_stand_in(**plugins):
    """An object whose ``hook`` calls the hooks of ``plugins`` (``{name: plugin object}``) and
    whose ``plugins`` is their ``pluggy.PluginManager``."""
    manager = new_hook_manager()
    for name, plugin in plugins.items():
        manager.register(plugin, name=name)
    return SimpleNamespace(hook=manager.hook, plugins=manager)


def plugin_answering(**answers):
    """A plugin whose hook ``deepspeed_<name>`` returns ``answers[name]`` (taking no argument):
    ``plugin_answering(stateful={"counter": counter})`` hands the engine one Stateful object."""
    from deepspeed.hooks import hookimpl

    return SimpleNamespace(**{f"deepspeed_{name}": hookimpl(lambda answer=answer: answer)
                              for name, answer in answers.items()})
