"""Is torch itself? An identity snapshot of the namespaces ZeRO, the flops profiler and
inference patch (``torch``, ``torch.nn.functional``, ``torch.nn.Module``, ``torch.Tensor`` and
every ``nn.Module`` subclass's ``__init__``), and what differs from it later.

Take the snapshot before importing the feature under test, in a fresh rank (``Scenarios`` in a
function ``run_fresh`` runs), so an earlier test's leak cannot hide in the reference. The
``unlisted`` check keeps a plugin's README and patch-module docstring naming every patch seen.
"""
import torch
import torch.nn.functional as F

_ABSENT = "<absent>"
PYTHON_CACHES = ("__slotnames__",)  # copyreg caches it on a class the first time one is pickled
OWNERS = {"torch": torch, "torch.nn.functional": F, "torch.nn.Module": torch.nn.Module,
          "torch.Tensor": torch.Tensor}


def _module_classes():
    seen, stack = set(), [torch.nn.Module]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
    return seen | {torch.nn.Module}


def snapshot():
    """Every entry of the owners' namespaces, and the ``__init__`` each ``nn.Module`` subclass
    defines, as the objects themselves."""
    import torch._dynamo  # noqa: F401  importing it wraps torch.manual_seed: torch's own change

    entries = {(label, name): value for label, owner in OWNERS.items()
               for name, value in vars(owner).items()}
    inits = {cls: vars(cls).get("__init__", _ABSENT) for cls in _module_classes()}
    return entries, inits


def differences(before):
    """Sorted descriptions of what is not the object it was in ``before``: entries replaced,
    removed or added (a submodule torch imported lazily since, or a cache Python itself adds, is
    not a difference), and the ``__init__`` of classes defined since that carry a ZeRO
    wrapper."""
    entries, inits = before
    found = []
    for label, owner in OWNERS.items():
        now = vars(owner)
        for (where, name), value in entries.items():
            if where == label and now.get(name, _ABSENT) is not value:
                found.append(f"{label}.{name} replaced")
        for name, value in now.items():
            if (label, name) not in entries and not isinstance(value, type(torch)) \
                    and name not in PYTHON_CACHES:
                found.append(f"{label}.{name} added")
    for cls in _module_classes():
        init = vars(cls).get("__init__", _ABSENT)
        if cls in inits:
            if init is not inits[cls]:
                found.append(f"{cls.__qualname__}.__init__ replaced")
        elif getattr(init, "_ds_zero_init", False):
            found.append(f"{cls.__qualname__}.__init__ wrapped (defined later)")
    return sorted(found)


EVERY_MODULE_INIT = "`__init__` of every `torch.nn.Module` subclass"


def unlisted(found, text):
    """The patched attributes among ``found`` (from ``differences``) that ``text`` (a README or
    a docstring) does not name: as `owner.attribute`, or, for ``__init__`` wrappers, by the
    phrase ``EVERY_MODULE_INIT``."""
    text = text.replace("``", "`")
    missing = set()
    for entry in found:
        attribute = entry.split(" ")[0]
        wanted = EVERY_MODULE_INIT if attribute.endswith(".__init__") else f"`{attribute}`"
        if wanted not in text:
            missing.add(attribute)
    return sorted(missing)


UNPATCHED = {"differences": [], "live": []}


class Scenarios:
    """Records, scenario by scenario, what differs from a snapshot taken when it is created.

    Create it in a fresh rank before importing ``package`` (the feature under test); it notes
    whether ``package`` was imported already, which ``run_fresh`` refuses."""

    def __init__(self, package):
        import sys

        self.results = {"imported before the snapshot": package in sys.modules}
        self.before = snapshot()

    def check(self, scenario, **extra):
        from deepspeed.utils import patching

        self.results[scenario] = {"differences": differences(self.before),
                                  "live": patching.live_patches(), **extra}


def run_fresh(dist_pool, scenarios, args=()):
    """``scenarios(*args)`` (which returns ``Scenarios.results``) in one new rank."""
    result = dist_pool.run(scenarios, world_size=1, fresh=True, timeout=240, args=args)[0]
    assert result["imported before the snapshot"] is False
    return result
