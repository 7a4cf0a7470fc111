"""Launcher flags whose work a plugin does (upstream's ``--autotuning``, ``--elastic_training``):
the runner names none of them in code.

Every installed plugin may add flags to the ``deepspeed`` command's parser
(``deepspeed_launcher_arguments``); when a command line sets one, the runner hands the whole
command to whichever installed plugin answers ``deepspeed_launcher_command``. The seams are
hooks rather than imports so that the launcher, like the rest of the core, never imports a
feature, and a third-party package can provide or replace a flag through the same entry-point
group. ``LAUNCHER_FLAGS`` only lists the documented ones, so that a flag whose plugin is not
installed gets "no installed plugin provides it" instead of argparse's "unrecognized argument"
(the same courtesy ``deepspeed.config.feature_sections`` gives config keys).
"""
# documented launcher flag -> the feature (as the docs name it) that it runs
LAUNCHER_FLAGS = {"--autotuning": "autotuning",
                  "--elastic_training": "elastic training",
                  "--min_elastic_nodes": "elastic training",
                  "--max_elastic_nodes": "elastic training"}


def add_plugin_arguments(parser):
    """Let every installed plugin add its flags to ``parser``; returns ``{action: plugin
    name}`` of the argparse actions they added (each names its ``dest`` and
    ``option_strings``)."""
    from deepspeed.plugin_manager import PluginCatalog

    added = {}
    hook = PluginCatalog().installed_hook.deepspeed_launcher_arguments
    for impl in reversed(hook.get_hookimpls()):  # pluggy's order: last registered first
        for action in impl.function(parser=parser) or ():
            added[action] = impl.plugin_name
    return added


def missing_plugin_flag(argv, actions):
    """The first documented plugin flag in ``argv`` that no installed plugin added, or None."""
    provided = {option for action in actions for option in action.option_strings}
    for token in argv:
        flag = token.split("=", 1)[0]
        if flag in LAUNCHER_FLAGS and flag not in provided:
            return flag
    return None


def missing_plugin_problem(flag):
    return (f"{flag} is a DeepSpeed launcher flag, but no installed plugin provides it (it runs "
            f"{LAUNCHER_FLAGS[flag]}); install that plugin or drop {flag}")


def given_plugin_flags(args, actions):
    """The plugin-added actions whose flags this command line set (a value other than the
    default)."""
    return [action for action in actions if getattr(args, action.dest) != action.default]


def check_one_plugin_command(given, actions):
    """Two flags that each hand the whole command to a different plugin cannot be combined."""
    owners = {}
    for action in given:
        owners.setdefault(actions[action], action.option_strings[0])
    if len(owners) > 1:
        flags = " and ".join(owners.values())
        raise ValueError(f"{flags} cannot be combined: each hands the whole command to its own "
                         f"plugin")


def run_plugin_command(args, argv, given, error_type=RuntimeError):
    """Let the plugin that owns the given flags run the command; returns its exit status, or
    raises ``error_type`` (the runner's ``LauncherError``: passed in, since the runner imports
    this module) when no installed plugin answers."""
    from deepspeed.plugin_manager import PluginCatalog

    status = PluginCatalog().installed_hook.deepspeed_launcher_command(args=args, argv=argv)
    if status is None:
        flags = ", ".join(action.option_strings[0] for action in given)
        raise error_type(f"{flags}: no installed plugin runs the command for this flag "
                         f"(deepspeed_launcher_command)")
    return status
