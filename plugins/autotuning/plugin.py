"""The ``autotuning`` plugin: owns the ``autotuning`` section, measures experiments inside
training jobs, and runs ``deepspeed --autotuning tune|run`` for the launcher.

Inside a job it is enabled only when the config is one of the autotuner's experiments
(``autotuning.metric_path`` set, or ``autotuning.model_info.profile``): a plain training run
with ``"autotuning": {"enabled": true}`` in its config trains normally.
"""
from deepspeed.autotuning.config import AutotuningConfig
from deepspeed.hooks import hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin

SECTION = "autotuning"


class AutotuningPlugin(DeepSpeedPlugin):
    config_sections = {SECTION: AutotuningConfig}
    depends_on = ("plan",)  # the memory model and estimate the search prunes with
    enabled_by = "autotuning.metric_path or autotuning.model_info.profile (set by the autotuner)"

    def __init__(self):
        self.probe = None

    def is_enabled(self, config, sections):
        section = config.section(SECTION) if config.has_section(SECTION) else None
        if section is None or not section.enabled:
            return False
        return bool(section.metric_path or (section.model_info and section.model_info.profile))

    @hookimpl
    def deepspeed_engine_init(self, engine, config):
        from deepspeed.autotuning.probe import ExperimentProbe

        self.probe = ExperimentProbe(engine, config.section(SECTION))

    @hookimpl
    def deepspeed_before_forward(self, engine):
        self.probe.before_forward()

    @hookimpl
    def deepspeed_after_forward(self, engine):
        self.probe.after_forward()

    @hookimpl
    def deepspeed_before_backward(self, engine):
        self.probe.before_backward()

    @hookimpl
    def deepspeed_after_step(self, engine):
        self.probe.after_step()

    @hookimpl
    def deepspeed_launcher_arguments(self, parser):
        return [parser.add_argument(
            "--autotuning", type=str, default="", choices=("tune", "run"),
            help="Autotune the DeepSpeed config ('tune'), then also train with the best one "
                 "('run') (autotuning plugin).")]

    @hookimpl
    def deepspeed_launcher_command(self, args, argv):
        if not getattr(args, "autotuning", None):
            return None
        from deepspeed.autotuning.autotuner import run_autotuning

        return run_autotuning(args, argv)
