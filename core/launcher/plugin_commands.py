"""Launcher flags whose work a plugin does: ``--autotuning`` and ``--elastic_training``.

The runner parses and checks them like any flag, then hands the whole command to whichever
installed plugin answers the ``deepspeed_launcher_command`` hook (``deepspeed.autotuning``,
``deepspeed.elasticity``). The seam is a hook rather than an import so that the launcher, like
the rest of the core, never imports a feature: a missing plugin is a clear error naming it, and
a third-party package can provide or replace either flag through the same entry-point group.
"""
# flag -> the plugin (import name) that provides it
PLUGIN_FLAGS = {"--autotuning": "deepspeed.autotuning",
                "--elastic_training": "deepspeed.elasticity"}


def check_plugin_flags(args):
    """Reject combinations of the plugin-provided flags that have no meaning."""
    if args.autotuning and args.elastic_training:
        raise ValueError("--autotuning and --elastic_training cannot be combined: autotuning "
                         "runs fixed-size experiments")
    if not args.elastic_training and (args.min_elastic_nodes != -1 or args.max_elastic_nodes != -1):
        raise ValueError("--min_elastic_nodes/--max_elastic_nodes need --elastic_training")
    for flag, value in (("--min_elastic_nodes", args.min_elastic_nodes),
                        ("--max_elastic_nodes", args.max_elastic_nodes)):
        if value == 0 or value < -1:
            raise ValueError(f"{flag} must be a positive integer (or -1 for the default), "
                             f"got {value}")
    if 0 < args.max_elastic_nodes < args.min_elastic_nodes:
        raise ValueError(f"--max_elastic_nodes ({args.max_elastic_nodes}) is smaller than "
                         f"--min_elastic_nodes ({args.min_elastic_nodes})")


def run_plugin_command(args, argv, error_type=RuntimeError):
    """Let the plugin that owns the given flag run the command; returns its exit status, or
    raises ``error_type`` (the runner's ``LauncherError``: passed in, since the runner imports
    this module) naming the missing plugin."""
    from deepspeed.plugin_manager import PluginCatalog

    flag = "--autotuning" if args.autotuning else "--elastic_training"
    status = PluginCatalog().installed_hook.deepspeed_launcher_command(args=args, argv=argv)
    if status is None:
        raise error_type(f"{flag} is provided by the plugin {PLUGIN_FLAGS[flag]}, which is "
                         f"not installed (no installed plugin answers it); install it or drop "
                         f"{flag}")
    return status
