"""The flops-profiler plugin: profile the forward of training step ``profile_step``.

Enabled by ``flops_profiler.enabled``. On global rank 0 it starts the profiler before the first
forward of that step, stops it after that forward (so backward and the optimizer run
unpatched), times that micro-batch's backward and the step itself for the summary, and prints
the profile once, after the step's optimizer update. A profiled forward that raises leaves the
profiler running until the next forward returns, ``engine.destroy()``, or the engine is
garbage-collected, whichever comes first.
"""
import time
import weakref

from deepspeed.hooks import hookimpl
from deepspeed.plugin_manager import DeepSpeedPlugin
from deepspeed.profiling.config import FlopsProfilerConfig
from deepspeed.utils.lazy_module import lazy_module

dist = lazy_module("deepspeed.comm")  # loaded on first use (the launcher imports this plugin without torch)

SECTION = "flops_profiler"


def _now():
    from deepspeed.accelerator import get_accelerator

    get_accelerator().synchronize()
    return time.perf_counter()


class FlopsProfilerPlugin(DeepSpeedPlugin):
    config_sections = {SECTION: FlopsProfilerConfig}
    enabled_by = "flops_profiler.enabled"

    def __init__(self):
        self.config = None
        self.profiler = None
        self.phase = "waiting"  # -> forward -> backward -> step -> done
        self._started_at = None

    @hookimpl
    def deepspeed_engine_init(self, engine, config):
        from deepspeed.profiling.flops_profiler import FlopsProfiler

        self.config = config.section(SECTION)
        rank = dist.get_rank() if dist.is_initialized() else 0
        if rank != 0:
            self.phase = "done"  # only rank 0 profiles and prints
            return
        self.profiler = FlopsProfiler(engine.module, ds_engine=engine,
                                      recompute_fwd_factor=self.config.recompute_fwd_factor)
        # an engine dropped without destroy() must not leave torch's ops wrapped (the callback
        # holds the op wrappers' owner, which holds no reference to the engine)
        weakref.finalize(engine, self.profiler.op_recorder.uninstall)

    def _in_profile_step(self, engine):
        return engine.global_steps + 1 == self.config.profile_step

    @hookimpl
    def deepspeed_before_forward(self, engine):
        if self.phase == "waiting" and self._in_profile_step(engine):
            self.profiler.start_profile()
            self.phase = "forward"

    @hookimpl
    def deepspeed_after_forward(self, engine):
        if self.phase == "forward":
            self.profiler.stop_profile()
            self.phase = "backward"

    @hookimpl
    def deepspeed_before_backward(self, engine):
        if self.phase == "backward":
            self._started_at = _now()

    @hookimpl
    def deepspeed_after_backward(self, engine):
        if self.phase == "backward" and self._started_at is not None:
            self.profiler.latencies["bwd"] = _now() - self._started_at
            self.phase = "step"

    @hookimpl
    def deepspeed_before_step(self, engine):
        if self.phase in ("backward", "step"):
            self._started_at = _now()

    @hookimpl
    def deepspeed_engine_destroy(self, engine):
        if self.profiler is not None:
            self.profiler.end_profile()  # torch's own ops back, also after a forward that raised
            self.phase = "done"

    @hookimpl
    def deepspeed_after_step(self, engine):
        if self.phase not in ("backward", "step"):
            return
        if self.phase == "step":
            self.profiler.latencies["step"] = _now() - self._started_at
        cfg = self.config
        self.profiler.print_model_profile(profile_step=cfg.profile_step,
                                          module_depth=cfg.module_depth,
                                          top_modules=cfg.top_modules, detailed=cfg.detailed,
                                          output_file=cfg.output_file)
        self.profiler.end_profile()
        self.phase = "done"
