"""Every change ZeRO makes to torch itself, and why; each one is installed and restored through a
``deepspeed.utils.patching.PatchSet`` (reference-counted, exact restore, undone on a failed
install), and nothing else in the zero plugin assigns to torch's attributes.

Process-wide, while a ZeRO-3 engine lives (``ATTRIBUTE_WATCH``, one user per engine; undone by
``engine.destroy()`` or when the engine is garbage-collected):

- ``torch.nn.Module.__getattr__``: a read of a partitioned parameter that is not gathered
  (``module.weight`` of a module whose forward is not the one running) gathers it for the
  running module: automatic external-parameter detection. ``__getattr__`` only runs for
  parameters, buffers and submodules, so ordinary attribute reads cost nothing extra.

Process-wide, while a ``zero.Init`` context is open (``patch_module_construction`` and
``patch_tensor_factories``, one ``PatchSet`` per ``Init``; undone when the context exits,
normally or by an exception):

- ``__init__`` of every ``torch.nn.Module`` subclass that defines one (torch's, the user's,
  any library's): when the outermost ``__init__`` of a module returns, its parameters are
  partitioned, so no more than one module is ever whole and a model larger than one process's
  memory can be built.
- ``torch.nn.Module.__init_subclass__``: classes defined inside the context get the same
  ``__init__`` wrapper.
- ``torch.nn.Module.apply`` (unless the config sets ``zero_optimization.override_module_apply:
  false``): a model's own initialisation (Hugging Face's ``self.apply(self._init_weights)`` in
  its constructor) would otherwise edit the empty placeholders of the submodules already
  partitioned, and the custom initialisation would be lost without a word. The outermost
  ``apply`` gathers every partitioned parameter of the module it is called on, runs ``fn``
  over the tree as torch does, then keeps rank 0's values (``GatheredParameters(...,
  modifier_rank=0)``) and partitions them again. Gathering the whole tree is what makes any
  ``fn`` work (one that reaches into children too); the price is a slower construction and,
  for that moment, the tree whole on every rank, which ``override_module_apply: false`` avoids
  (``fn`` then sees the placeholders and must gather what it edits itself).
- ``torch.empty``, ``torch.zeros``, ``torch.ones``, ``torch.full``, ``torch.arange`` (only with
  ``Init(dtype=...)``): buffers and temporaries a module builds get the dtype its parameters are
  cast to, else the first forward mixes dtypes. Each wraps torch's own function (captured in
  ``TORCH_FACTORIES`` when this module is imported), never an enclosing ``Init``'s wrapper.

Per object, not process-wide (left in ``partition_parameters``): ``all_gather``, ``partition``,
``partition_numel``, ``padding_size`` and ``ds_summary`` are bound onto each partitioned
parameter (upstream's API on the parameter itself); they live and die with the parameter.

Nested ``Init`` contexts: the inner one's factory wrappers and ``__init_subclass__`` are the
visible ones while it is open; classes the outer one already wraps keep the outer's wrapper
(the inner holds it, so it stays even if the outer exits first). Every ``PatchSet`` restores
independently, so contexts may also exit in any order.
"""
import functools
import threading

import torch

from deepspeed.utils.patching import PatchSet
from deepspeed.zero.param_status import ZeroParamStatus

# torch's own tensor constructors, captured before any Init replaces them: the factory wrappers
# call these, and code that customises the wrapping (transformers keeps RoPE ``arange`` buffers
# in their explicit dtype) compares against them
TORCH_FACTORIES = {name: getattr(torch, name) for name in ("empty", "zeros", "ones", "full",
                                                          "arange")}
_INIT_MARK = "_ds_zero_init"  # set on every __init__ wrapper


# ------------------------------------------------------------------ while an engine lives
def _watch_parameter_reads(patches):
    not_available = ZeroParamStatus.NOT_AVAILABLE
    original = torch.nn.Module.__getattr__

    def __getattr__(self, name):
        value = original(self, name)
        if (type(value) is torch.nn.Parameter or isinstance(value, torch.nn.Parameter)) \
                and getattr(value, "ds_status", None) is not_available:
            coordinator = getattr(value, "ds_coordinator", None)
            if coordinator is not None and coordinator._running:
                coordinator.fetch_external(value)
        return value

    patches.replace(torch.nn.Module, "__getattr__", __getattr__)


ATTRIBUTE_WATCH = PatchSet("zero: nn.Module.__getattr__ (external parameter reads)",
                           _watch_parameter_reads)


# ------------------------------------------------------------------ while zero.Init is open
def patch_module_construction(patches, after_init):
    """Wrap ``__init__`` of every ``nn.Module`` subclass (existing ones, and those defined while
    ``patches`` is installed) so that ``after_init(module)`` runs once the outermost
    ``__init__`` of each constructed module returned."""

    def wrap(cls):
        if "__init__" not in cls.__dict__:
            return
        original = cls.__dict__["__init__"]
        if getattr(original, _INIT_MARK, False):
            # an enclosing Init's wrapper: hold it, so it stays while this context is open
            patches.replace(cls, "__init__", original)
            return

        @functools.wraps(original)
        def __init__(module, *args, **kwargs):
            original(module, *args, **kwargs)
            # only the outermost __init__ of this object acts (subclasses call super)
            if _outermost_init(module, cls):
                after_init(module)

        setattr(__init__, _INIT_MARK, True)
        patches.replace(cls, "__init__", __init__)

    for cls in _all_subclasses(torch.nn.Module) | {torch.nn.Module}:
        wrap(cls)

    def __init_subclass__(cls, **kwargs):
        super(torch.nn.Module, cls).__init_subclass__(**kwargs)
        if patches.installed:  # not a class another thread defines while the context exits
            wrap(cls)

    patches.replace(torch.nn.Module, "__init_subclass__", classmethod(__init_subclass__))


def patch_module_apply(patches, gathered):
    """Replace ``torch.nn.Module.apply`` so that the outermost call runs inside
    ``gathered(module)`` (a context holding the partitioned parameters of ``module``'s tree
    whole and publishing the edits on exit); the calls torch's ``apply`` makes on the children
    run plainly inside it."""
    original = torch.nn.Module.apply

    def apply(module, fn):
        if getattr(_APPLYING, "active", False):
            return original(module, fn)
        _APPLYING.active = True
        try:
            with gathered(module):
                return original(module, fn)
        finally:
            _APPLYING.active = False

    functools.update_wrapper(apply, original)
    patches.replace(torch.nn.Module, "apply", apply)


_APPLYING = threading.local()  # inside an outermost apply of this thread


def patch_tensor_factories(patches, make_wrapper, dtype):
    """Replace torch's tensor constructors by ``make_wrapper(torch_own, dtype,
    target_device=None)``."""
    for name, original in TORCH_FACTORIES.items():
        patches.replace(torch, name, make_wrapper(original, dtype, target_device=None))


def _outermost_init(module, cls):
    """True when ``cls`` is the most derived class of ``module`` defining ``__init__``: that
    call returns last, after every parameter of this module was created and initialised."""
    for klass in type(module).__mro__:
        if "__init__" in klass.__dict__:
            return klass is cls
    return False


def _all_subclasses(cls):
    seen = set()
    stack = [cls]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
    return seen
