"""ZeRO-3 leaf modules: modules whose whole subtree is gathered at once
(`deepspeed.utils.set_z3_leaf_modules`: exported into `deepspeed.utils` through the
entry-point group `deepspeed.exports.utils`, and at `deepspeed.utils.z3_leaf_module`).

ZeRO-3 gathers each module's parameters just before that module runs. A mixture-of-experts
layer runs only the experts its router picks, and the picks differ between ranks; per-expert
gathering would then issue different all-gathers on different ranks, and the collectives
would pair up wrongly or hang. Marking the MoE block as a *leaf* makes ZeRO-3 gather every
parameter under it when the block starts and release them when it ends, so all ranks issue the
same collectives whatever their routers chose. The marker is a plain attribute: it costs
nothing when ZeRO-3 is off, and it can be set before or after ``deepspeed.initialize``.

torch appears only in annotations: ``deepspeed.utils`` imports this module eagerly (its function
``z3_leaf_module`` shares the module's name, so it must be bound after the module is), and the
launcher imports ``deepspeed.utils`` in processes that never touch a tensor.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from deepspeed.utils.arg_checks import check_names

if TYPE_CHECKING:
    import torch

LEAF_ATTRIBUTE = "_z3_leaf"
_EDITS = [0]  # bumped by every (un)marking: what ZeRO-3 decided per trace may have changed


def leaf_mark_edits() -> int:
    """How many times ``set_z3_leaf_modules``/``unset_z3_leaf_modules`` have run."""
    return _EDITS[0]


def z3_leaf_module(module) -> bool:
    """True if ``module`` is gathered as one unit under ZeRO-3. Read from the instance dict
    (where ``setattr`` puts the mark): ZeRO-3 asks this in every module hook, and a plain
    ``getattr`` of a missing name goes through ``nn.Module.__getattr__`` and an exception."""
    return bool(module.__dict__.get(LEAF_ATTRIBUTE, False))


def z3_leaf_parameter(param) -> bool:
    """True if ``param`` belongs to a leaf module's subtree (set by ``set_z3_leaf_modules``)."""
    return bool(getattr(param, "ds_z3_leaf_module", None))


def get_z3_leaf_modules(model: torch.nn.Module):
    """The modules of ``model`` currently marked as leaves."""
    return [module for module in model.modules() if z3_leaf_module(module)]


def _matches(module, leaf_classes):
    for spec in leaf_classes:
        if isinstance(spec, str):
            if type(module).__name__ == spec:
                return True
        elif isinstance(module, spec):
            return True
    return False


def _mark(matched, flag):
    _EDITS[0] += 1
    for module in matched:
        setattr(module, LEAF_ATTRIBUTE, flag)
        for param in module.parameters():
            param.ds_z3_leaf_module = module if flag else None
    return matched


def _set_leaf_flag(model, leaf_classes, flag):
    if isinstance(leaf_classes, (str, type)):
        leaf_classes = [leaf_classes]
    leaf_classes = list(leaf_classes)
    bad = [c for c in leaf_classes if not isinstance(c, (str, type))]
    if bad or not leaf_classes:
        raise ValueError(f"leaf_module_classes must be a non-empty list of module classes or "
                         f"class names, got {leaf_classes!r}")
    matched = [module for module in model.modules() if _matches(module, leaf_classes)]
    if not matched:
        names = [c if isinstance(c, str) else c.__name__ for c in leaf_classes]
        raise ValueError(f"no module of class {names} found in {type(model).__name__}: "
                         f"nothing to mark as a ZeRO-3 leaf module")
    return _mark(matched, flag)


def set_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes):
    """Mark every module of ``model`` that is an instance of one of ``leaf_module_classes``
    (classes or class names) as a ZeRO-3 leaf; returns the marked modules. Raises
    ``ValueError`` when nothing matches, since a misspelled class would otherwise leave an MoE
    model to hang at its first uneven routing."""
    return _set_leaf_flag(model, leaf_module_classes, True)


def unset_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes):
    """Undo ``set_z3_leaf_modules`` for those classes; returns the modules unmarked."""
    return _set_leaf_flag(model, leaf_module_classes, False)


def set_z3_leaf_modules_by_name(model: torch.nn.Module, module_names, flag=True,
                                raise_if_not_found=True):
    """Mark (``flag=False``: unmark) the modules of ``model`` named in ``module_names`` (their
    names in ``model.named_modules()``, e.g. ``"layers.0.mlp"``) as ZeRO-3 leaves; returns them
    in the order named. A name ``model`` does not have raises ``ValueError`` naming it (with
    ``raise_if_not_found=False`` it is skipped), for the reason ``set_z3_leaf_modules`` raises."""
    module_names = check_names("module_names", module_names)
    modules = dict(model.named_modules())
    missing = [name for name in module_names if name not in modules]
    if missing and raise_if_not_found:
        raise ValueError(f"no module named {missing} in {type(model).__name__} (names are those "
                         f"of model.named_modules(), e.g. {list(modules)[1:4]}): nothing to mark "
                         f"as a ZeRO-3 leaf module")
    return _mark([modules[name] for name in module_names if name in modules], flag)


__all__ = ["get_z3_leaf_modules", "set_z3_leaf_modules", "set_z3_leaf_modules_by_name",
           "unset_z3_leaf_modules", "z3_leaf_module", "z3_leaf_parameter"]
