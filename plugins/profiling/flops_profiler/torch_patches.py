"""The flops profiler's changes to torch: while a profile runs (``start_profile`` ...
``stop_profile``) each op below is replaced by a wrapper that calls torch's own op and charges
its cost to the innermost profiled module. Wrapping the functions, not the modules, is why a
custom module that calls ``F.linear`` directly is counted as well as ``nn.Linear``.

- ``torch.nn.functional``: ``linear``, ``conv1d``, ``conv2d``, ``conv3d``,
  ``conv_transpose1d``, ``conv_transpose2d``, ``conv_transpose3d``, ``softmax``,
  ``log_softmax``, ``scaled_dot_product_attention``, ``batch_norm``, ``layer_norm``,
  ``group_norm``, ``instance_norm``, ``rms_norm``, ``embedding``, ``interpolate``, ``upsample``,
  ``upsample_nearest``, ``upsample_bilinear``; the activations ``relu``, ``relu_``, ``prelu``,
  ``elu``, ``elu_``, ``leaky_relu``, ``leaky_relu_``, ``relu6``, ``silu``, ``gelu``, ``mish``,
  ``hardswish``, ``sigmoid``, ``tanh``, ``softplus``, ``selu``, ``celu``; the pools
  ``avg_pool1d``, ``avg_pool2d``, ``avg_pool3d``, ``max_pool1d``, ``max_pool2d``,
  ``max_pool3d``, ``adaptive_avg_pool1d``, ``adaptive_avg_pool2d``, ``adaptive_avg_pool3d``,
  ``adaptive_max_pool1d``, ``adaptive_max_pool2d``, ``adaptive_max_pool3d``.
- ``torch``: ``matmul``, ``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``mul``, ``add``, ``einsum``.
- ``torch.Tensor``: ``matmul``, ``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``mul``, ``add``,
  ``__matmul__`` (tensor methods and ``@`` do not go through the ``torch.*`` functions).

``counting.op_rules`` holds the rule that prices each op (an op the running torch lacks is
skipped); a test keeps this list and the plugin's README equal to it. The replacements are one
``deepspeed.utils.patching.PatchSet``: ``stop_profile`` / ``end_profile`` put torch's own
objects back (``get_model_profile`` also when the profiled call raises; the engine plugin after
the profiled forward, on ``engine.destroy()``, or when the engine is garbage-collected), and a
``Tensor`` method inherited from torch's C base class is inherited again rather than left as a
copy in ``torch.Tensor.__dict__``.
"""
import threading

import torch.nn.functional as F

from deepspeed.profiling.flops_profiler.counting import PRECHECKS, op_rules
from deepspeed.utils.patching import PatchSet


class OpRecorder:
    """Installs the wrappers and routes each op's cost to the innermost profiled module.

    Only the outermost wrapped call is counted, so an op implemented through another wrapped op
    is not counted twice. One recorder may be installed at a time: two would wrap each other."""

    _installed = None
    # re-entrant: garbage collection during install may finalize an earlier engine's profiler,
    # whose uninstall (a no-op then: it is not the installed one) takes the lock again
    _lock = threading.RLock()

    def __init__(self):
        self.frames = []  # per active module: list of (op, flops, macs), or None when ignored
        self._patches = PatchSet("flops profiler: torch op wrappers", self._wrap_ops)
        self._depth = 0

    @property
    def installed(self):
        return OpRecorder._installed is self

    def install(self):
        with OpRecorder._lock:
            if OpRecorder._installed is self:
                return
            if OpRecorder._installed is not None:
                raise RuntimeError("another FlopsProfiler is already profiling; call "
                                   "stop_profile() on it before starting this one")
            self._patches.install()
            OpRecorder._installed = self

    def uninstall(self):
        with OpRecorder._lock:
            if OpRecorder._installed is not self:
                return
            self._patches.restore()
            self.frames = []
            OpRecorder._installed = None

    def _wrap_ops(self, patches):
        for owner, name, rule in op_rules():
            original = getattr(owner, name)
            patches.replace(owner, name, self._wrap(name, original, rule, owner is F))

    def _wrap(self, name, original, rule, owner_is_functional):
        recorder = self
        precheck = PRECHECKS.get(name) if owner_is_functional else None

        def counted(*args, **kwargs):
            if recorder._depth or not recorder.frames:
                return original(*args, **kwargs)
            if precheck is not None:
                precheck(*args, **kwargs)
            recorder._depth += 1
            try:
                out = original(*args, **kwargs)
            finally:
                recorder._depth -= 1
            frame = recorder.frames[-1]
            if frame is not None:
                flops, macs = rule(out, *args, **kwargs)
                frame.append((name, flops, macs))
            return out

        counted.__name__ = getattr(original, "__name__", name)
        counted.__doc__ = getattr(original, "__doc__", None)
        counted.__wrapped__ = original
        return counted
