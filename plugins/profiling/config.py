"""The ``flops_profiler`` config section."""
from typing import Optional

from pydantic import Field

from deepspeed.config import DeepSpeedConfigModel


class FlopsProfilerConfig(DeepSpeedConfigModel):
    """Profile one training step's forward from the config, with no code change."""

    tested_by = {
        "enabled": "tests/core/config/test_deepspeed_config.py::test_documented_feature_key_without_plugin",
        "profile_step": "tests/plugins/profiling/test_flops_profiler_engine.py::test_disabled_plugin_runs_no_hook",
        "module_depth": "tests/plugins/profiling/test_flops_profiler.py::test_print_depth_and_detail_switches",
        "detailed": "tests/plugins/profiling/test_flops_profiler.py::test_print_depth_and_detail_switches",
        "output_file": "tests/plugins/profiling/test_flops_profiler.py::test_print_model_profile_to_file",
    }

    enabled: bool = False
    recompute_fwd_factor: float = Field(0.0, ge=0.0)
    """Fraction of the forward recomputed in backward (activation checkpointing); backward
    flops are estimated as (2 + recompute_fwd_factor) x forward."""
    profile_step: int = Field(1, ge=1)
    """The global training step (1 = the first) whose forward is profiled."""
    module_depth: int = Field(-1, ge=-1)
    """Depth of the printed module tree; -1 prints every depth."""
    top_modules: int = Field(1, ge=1)
    detailed: bool = True
    output_file: Optional[str] = None
    """Print the profile here instead of stdout."""
