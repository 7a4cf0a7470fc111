"""The ``flops_profiler`` config section."""
from typing import Optional

from pydantic import Field

from deepspeed.config import DeepSpeedConfigModel



# the tests named in the key-effect table (``tested_by``, see deepspeed.config.model)
ENGINE = "tests/plugins/profiling/test_flops_profiler_engine.py::"

class FlopsProfilerConfig(DeepSpeedConfigModel):
    """Profile one training step's forward from the config, with no code change."""

    # what each key does here (see deepspeed.config.model)
    tested_by = {
        **dict.fromkeys(("enabled", "profile_step"),
                        ENGINE + "test_engine_profiles_the_configured_step_once"),
        **dict.fromkeys(("recompute_fwd_factor", "top_modules", "module_depth", "detailed"),
                        ENGINE + "test_recompute_fwd_factor_top_modules_depth_and_detail_shape_"
                                 "the_report"),
        "output_file": ENGINE + "test_two_ranks_rank0_writes_output_file",
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
