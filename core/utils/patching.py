"""Replace attributes of shared objects (torch functions, ``nn.Module`` methods, classes) for a
while, and put back exactly what was there.

Some features can only work by changing how torch behaves for everyone in the process for a
while: build parameters partitioned or on the meta device as modules are constructed, count the
flops of every ``F.linear`` call. Each such feature owns a ``PatchSet``: its ``build`` makes
the replacements (``replace(owner, name, value)``), ``install`` runs it and ``restore`` undoes
every replacement the set made. Nothing else in the package assigns to torch's attributes.

Why a shared helper rather than ``setattr`` / ``setattr back``:

- **Reference-counted.** ``install`` and ``restore`` nest: a set installed twice (two engines,
  a re-entered context) is built once and undone by the last ``restore``. A ``restore`` with
  nothing installed does nothing.
- **Exact.** Each patched attribute remembers the object that was in its owner's ``__dict__``
  before the first replacement, and restoring puts that very object back, or deletes the entry
  when there was none, so an inherited attribute (``Tensor.matmul`` lives on a C base class,
  ``nn.Module.__init_subclass__`` on ``object``) is inherited again instead of being shadowed
  by a copy of itself.
- **Composable.** Several sets may replace the same attribute at once (nested or overlapping
  contexts, an engine and a construction context): every attribute keeps a stack of the values
  sets put there, shows the newest, and when a set restores, its values leave the stack wherever
  they are, so sets may restore in any order and the original comes back after the last one.
- **Safe to fail.** An exception inside ``build`` undoes what it already replaced before it
  propagates, so a failed install leaves nothing behind.

A replacement that someone else overwrote while a set held the attribute is still undone (the
original is what ``restore`` promises); that case is logged, because the other party's patch is
dropped with ours.
"""
import threading

from deepspeed.utils.logging import logger

_ABSENT = object()  # the owner's __dict__ had no entry: restoring deletes ours
_LOCK = threading.RLock()  # replacements may be made while a build runs (classes defined then)
_SLOTS = {}  # (id(owner), name) -> _Slot, for every attribute some set has replaced


class _Slot:
    """One replaced attribute: its original, and the (set, value) layers, newest last."""

    __slots__ = ("owner", "name", "original", "layers")

    def __init__(self, owner, name):
        self.owner, self.name = owner, name
        self.original = vars(owner).get(name, _ABSENT)
        self.layers = []

    def show(self, expected):
        """Put the newest layer's value (or the original) on the owner; ``expected`` is what
        should be there now."""
        current = vars(self.owner).get(self.name, _ABSENT)
        if current is not expected:
            logger.warning(f"{_describe(self.owner, self.name)} was replaced by someone else while "
                           f"patched; restoring it drops that replacement too")
        value = self.layers[-1][1] if self.layers else self.original
        if value is _ABSENT:
            if self.name in vars(self.owner):
                delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, value)


def _describe(owner, name):
    return f"{getattr(owner, '__qualname__', getattr(owner, '__name__', repr(owner)))}.{name}"


class PatchSet:
    """The replacements one feature makes; see the module docstring.

    ``label`` names the feature in ``live_patches()``; ``build(patch_set)`` makes the
    replacements through ``replace`` (``build`` may be omitted when the owner calls ``replace``
    itself between ``install`` and ``restore``). Also a context manager (install / restore)."""

    def __init__(self, label, build=None):
        self.label = label
        self._build = build
        self._users = 0
        self._replaced = []  # slots this set has a layer in, in replacement order

    @property
    def users(self):
        """How many ``install`` calls wait for their ``restore``."""
        return self._users

    @property
    def installed(self):
        return self._users > 0

    def install(self):
        """Make the replacements, or only count one more user when already installed."""
        with _LOCK:
            self._users += 1
            if self._users > 1 or self._build is None:
                return self
            try:
                self._build(self)
            except BaseException:
                self._users = 0
                self._undo()
                raise
        return self

    def restore(self):
        """One user less; the last one puts every replaced attribute back."""
        with _LOCK:
            if self._users == 0:
                return
            self._users -= 1
            if self._users == 0:
                self._undo()

    def replace(self, owner, name, value):
        """Set ``owner.<name>`` to ``value`` until this set is restored; returns the value it
        had (what a wrapper should call). Only while installed."""
        with _LOCK:
            if not self._users:
                raise RuntimeError(f"{self.label}: replace({_describe(owner, name)}) outside "
                                   f"install() ... restore()")
            previous = getattr(owner, name, None)
            slot = _SLOTS.get((id(owner), name))
            if slot is None:
                slot = _SLOTS[(id(owner), name)] = _Slot(owner, name)
            setattr(owner, name, value)
            slot.layers.append((self, value))
            self._replaced.append(slot)
            return previous

    def _undo(self):
        for slot in reversed(self._replaced):
            index = max(i for i, (owner, _) in enumerate(slot.layers) if owner is self)
            value = slot.layers.pop(index)[1]
            if index == len(slot.layers):  # it was the visible one
                slot.show(expected=value)
            if not slot.layers:
                del _SLOTS[(id(slot.owner), slot.name)]
        self._replaced = []

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        self.restore()
        return False


def live_patches():
    """``(label, description)`` of every replacement in place now, oldest first per attribute:
    what a test or a debugging session checks to see that torch is itself again."""
    with _LOCK:
        return [(patch_set.label, _describe(slot.owner, slot.name))
                for slot in _SLOTS.values() for patch_set, _ in slot.layers]


def original(owner, name, default=None):
    """What ``owner.__dict__[name]`` held before any live ``PatchSet`` replaced it (its current
    entry when none did; ``default`` when there was no entry)."""
    with _LOCK:
        slot = _SLOTS.get((id(owner), name))
        value = slot.original if slot is not None else vars(owner).get(name, _ABSENT)
        return default if value is _ABSENT else value
