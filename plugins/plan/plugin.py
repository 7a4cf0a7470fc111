"""The ``plan`` plugin: registered so that the catalog knows the package, enabled by no
config. Planning happens before a job exists (``ds_plan``, ``deepspeed.plan``), so it has no
engine hook to implement; it owns no config section."""
from deepspeed.plugin_manager import DeepSpeedPlugin


class PlanPlugin(DeepSpeedPlugin):
    # deepspeed.plan.memory calls the ZeRO model-state estimators and its bucket rule;
    # deepspeed.plan.model_spec counts FLOPs with the flops profiler
    depends_on = ("zero", "flops_profiler", "moe")  # moe: its layers and gate capacity
    enabled_by = "never: ds_plan and deepspeed.plan run without an engine"

    def is_enabled(self, config, sections):
        return False
