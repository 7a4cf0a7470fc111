"""``FlopsProfiler``: per-module flops, MACs, params and forward latency of a model.

Module hooks open a frame for each module call; the op wrappers of ``torch_patches`` add each op's
cost to the innermost open frame, so every op is charged to exactly one module and a module's
total is its own ops plus its children's. The profile lives in attributes on the modules
(``__flops__``, ``__macs__``, ``__params__``, ``__duration__``) so it can be read while walking
the model, and ``end_profile`` removes them all.
"""
import time

import torch

from deepspeed.profiling.flops_profiler.torch_patches import OpRecorder
from deepspeed.profiling.flops_profiler.units import (duration_to_string, macs_to_string,
                                                      number_to_string, params_to_string)
from deepspeed.utils.lazy_exports import lazy_exports

_ATTRS = ("__flops__", "__macs__", "__params__", "__duration__", "__ignored__")


def _synchronize():
    """Latency is only meaningful once queued device work finished."""
    from deepspeed.accelerator import get_accelerator

    get_accelerator().synchronize()


def _param_numel(param):
    return int(getattr(param, "ds_numel", param.numel()))  # ZeRO-3 shards keep the full size


class FlopsProfiler:
    """Profiles the forward passes of ``model`` run between ``start_profile`` and
    ``stop_profile``.

    ``ds_engine`` (optional) supplies the world/dp/mp sizes, batch size and the engine's
    backward and step latencies for the summary; ``recompute_fwd_factor`` is the fraction of the
    forward recomputed in backward by activation checkpointing (bwd flops = (2 + factor)·fwd).
    """

    def __init__(self, model, ds_engine=None, recompute_fwd_factor=0.0):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"FlopsProfiler needs a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.ds_engine = ds_engine
        self.recompute_fwd_factor = recompute_fwd_factor
        self.started = False
        self.func_patched = False
        self._recorder = OpRecorder()
        self._handles = []
        self._starts = {}
        self.latencies = {}  # "bwd" / "step" seconds, filled by the engine integration

    @property
    def op_recorder(self):
        """What wraps torch's ops while profiling (``torch_patches.OpRecorder``); it holds no
        reference to the model or the engine, so a finalizer may hold it."""
        return self._recorder

    # ------------------------------------------------------------------ lifecycle
    def start_profile(self, ignore_list=None):
        """Hook every module (modules whose type is in ``ignore_list``, and everything they
        call, are left out of the counts) and wrap the profiled torch ops."""
        self.reset_profile()
        ignore = tuple(ignore_list or ())
        self._hook_modules(self.model, ignore, ignored=False)
        try:
            self._recorder.install()
        except BaseException:
            self.end_profile()  # refused (another profiler runs) or failed: leave no hooks
            raise
        self.func_patched = True
        self.started = True

    def _hook_modules(self, module, ignore, ignored):
        ignored = ignored or (bool(ignore) and isinstance(module, ignore))
        module.__ignored__ = ignored
        self._handles.append(module.register_forward_pre_hook(self._pre_hook))
        self._handles.append(module.register_forward_hook(self._post_hook))
        for child in module.children():
            self._hook_modules(child, ignore, ignored)

    def _pre_hook(self, module, inputs):
        if not self._recorder.installed:
            return
        self._recorder.frames.append(None if module.__ignored__ else [])
        _synchronize()
        self._starts.setdefault(module, []).append(time.perf_counter())

    def _post_hook(self, module, inputs, output):
        if not self._recorder.installed or not self._starts.get(module):
            return
        _synchronize()
        module.__duration__ += time.perf_counter() - self._starts[module].pop()
        frame = self._recorder.frames.pop()
        if frame:
            module.__flops__ += sum(flops for _, flops, _ in frame)
            module.__macs__ += sum(macs for _, _, macs in frame)

    def stop_profile(self):
        """Restore the original torch ops; the collected profile stays readable."""
        self._recorder.uninstall()
        self.func_patched = False

    def reset_profile(self):
        """Zero the counts on every module (adding the attributes where missing)."""
        for module in self.model.modules():
            module.__flops__ = 0
            module.__macs__ = 0
            module.__duration__ = 0.0
            module.__ignored__ = getattr(module, "__ignored__", False)
        self._starts = {}
        self._recorder.frames.clear()

    def end_profile(self):
        """Remove the hooks and every attribute the profiler added."""
        self.stop_profile()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for module in self.model.modules():
            for attr in _ATTRS:
                if attr in module.__dict__:
                    delattr(module, attr)
        self.started = False

    # ------------------------------------------------------------------ per-module totals
    def module_flops(self, module):
        return module.__flops__ + sum(self.module_flops(c) for c in module.children())

    def module_macs(self, module):
        return module.__macs__ + sum(self.module_macs(c) for c in module.children())

    def module_params(self, module):
        """Parameters of ``module`` and its children, each shared tensor once, none of an
        ignored module."""
        seen, total = set(), 0
        for sub in module.modules():
            if getattr(sub, "__ignored__", False):
                continue
            for param in sub.parameters(recurse=False):
                if id(param) not in seen:
                    seen.add(id(param))
                    total += _param_numel(param)
        return total

    def module_duration(self, module):
        return module.__duration__

    # ------------------------------------------------------------------ documented getters
    def get_total_flops(self, as_string=False):
        """Total forward flops of the profiled passes."""
        total = self.module_flops(self.model)
        return number_to_string(total) if as_string else total

    def get_total_macs(self, as_string=False):
        total = self.module_macs(self.model)
        return macs_to_string(total) if as_string else total

    def get_total_params(self, as_string=False):
        total = self.module_params(self.model)
        return params_to_string(total) if as_string else total

    def get_total_duration(self, as_string=False):
        """Forward latency of the top module, in seconds."""
        total = self.module_duration(self.model)
        return duration_to_string(total) if as_string else total

    # ------------------------------------------------------------------ printing
    def print_model_profile(self, profile_step=1, module_depth=-1, top_modules=1, detailed=True,
                            output_file=None):
        """Print the summary, the aggregated profile and (if ``detailed``) the module tree, to
        stdout or ``output_file`` (its directory is created). Does nothing before
        ``start_profile``."""
        if not self.started:
            return
        from deepspeed.profiling.flops_profiler.report import write_profile

        write_profile(self, profile_step, module_depth, top_modules, detailed, output_file)

    def plot_flops_by_module(self, path, depth=1):
        """Write a PNG at ``path``: one bar of forward flops per module ``depth`` levels below
        the model (default: its direct children). Needs matplotlib (the ``plots`` extra);
        returns the figure. (With ``output_file`` set, ``print_model_profile`` also writes this
        plot next to the text.)"""
        from deepspeed.profiling.flops_profiler.report import flops_figure
        from deepspeed.utils.plots import write_png

        figure = flops_figure(self, depth)
        write_png(figure, path)
        return figure

    def print_model_aggregated_profile(self, module_depth=-1, top_modules=1):
        """Print the ``top_modules`` module types by params, MACs and latency at each depth."""
        if not self.started:
            return
        from deepspeed.profiling.flops_profiler.report import aggregated_profile_lines

        print("\n".join(aggregated_profile_lines(self, module_depth, top_modules)))


# The API reference names ``deepspeed.profiling.flops_profiler.profiler.get_model_profile``
# (upstream defines it in this module). Here it lives in ``model_profile``, which imports this
# module for ``FlopsProfiler``, so it is read from there on first use.
_EXPORTS = {"get_model_profile": "deepspeed.profiling.flops_profiler.model_profile"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
