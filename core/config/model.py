"""`DeepSpeedConfigModel`: the pydantic base of every config section, core and plugin.

One base gives every section the same contract: unknown keys are errors (a typo must not silently
fall back to a default), a field can be set by its name or its alias, assignments are validated,
and renamed keys keep working for a while with a warning. pydantic's lax int already accepts
integral floats (`1e9`, `5.0`) and rejects `5.5`, which is exactly what JSON configs need.

Deprecated names are declared on the *new* field, either with the `deprecated_alias()` marker
(which can also convert the old value) or with `json_schema_extra={"deprecated_aliases": [...]}`:

    bf16: Annotated[BF16Config, deprecated_alias("bfloat16")] = Field(default_factory=BF16Config)
    offload_optimizer: Annotated[Optional[OffloadConfig],
                                 deprecated_alias("cpu_offload", convert=lambda on: ...)] = None
"""
import os
import sys
import typing
import warnings
from collections.abc import Mapping, MutableMapping, Sequence
from enum import Enum
from typing import Any, Callable, ClassVar, Dict, Iterator, List, Optional, Tuple

import pydantic
from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from deepspeed.config.errors import ConfigDeprecationWarning

AUTO = "auto"


class DeprecatedAlias:
    """Field metadata: `old_name` is an outdated spelling of the field it is attached to.

    `convert`, when given, maps the old value to a value of the new field (for renames that also
    changed shape, e.g. a bool flag that became a sub-section).
    """

    def __init__(self, old_name: str, convert: Optional[Callable[[Any], Any]] = None):
        self.old_name = old_name
        self.convert = convert

    def __repr__(self):
        return f"deprecated_alias({self.old_name!r})"


def deprecated_alias(old_name: str, convert: Optional[Callable[[Any], Any]] = None) -> DeprecatedAlias:
    """Declare `old_name` as a deprecated key of the annotated field (use inside `Annotated`)."""
    return DeprecatedAlias(old_name, convert)


def accepts_auto(field_info) -> bool:
    """Whether "auto" is a real value of this field (e.g. `Literal["auto", "step"]`), so that a
    user's "auto" there is not a leftover HF-Trainer placeholder."""
    extra = field_info.json_schema_extra
    if isinstance(extra, dict) and extra.get("accepts_auto"):
        return True
    return annotation_has_auto(field_info.annotation)


def annotation_has_auto(annotation) -> bool:
    if typing.get_origin(annotation) is typing.Literal:
        return AUTO in typing.get_args(annotation)
    return any(annotation_has_auto(arg) for arg in typing.get_args(annotation))


def is_union(annotation) -> bool:
    """`Union[...]`/`Optional[...]` and PEP 604 `X | Y` alike."""
    origin = typing.get_origin(annotation)
    return origin is typing.Union or (origin is not None and type(origin).__name__ == "UnionType")


def _is_model_class(obj) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseModel)


def model_classes_in(annotation) -> List[type]:
    """Pydantic model classes an annotation can hold directly (through Optional/Union)."""
    if _is_model_class(annotation):
        return [annotation]
    if is_union(annotation):
        found = []
        for arg in typing.get_args(annotation):
            found.extend(model_classes_in(arg))
        return found
    if typing.get_origin(annotation) is typing.Annotated:
        return model_classes_in(typing.get_args(annotation)[0])
    return []


def container_item_annotation(annotation):
    """For `Dict[str, X]`, `List[X]` (possibly inside Optional) return X; else None."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if is_union(annotation):
        for arg in args:
            item = container_item_annotation(arg)
            if item is not None:
                return item
        return None
    if origin in (dict, Mapping, MutableMapping) and len(args) == 2:
        return args[1]
    if origin in (list, tuple, Sequence) and args:
        return args[0]
    return None


def _deprecations_of(field_info) -> List[DeprecatedAlias]:
    found = [m for m in field_info.metadata if isinstance(m, DeprecatedAlias)]
    extra = field_info.json_schema_extra
    if isinstance(extra, dict):
        names = extra.get("deprecated_aliases") or []
        found.extend(DeprecatedAlias(name) for name in ([names] if isinstance(names, str) else names))
    return found


_INTERNAL_DIRS = (os.path.dirname(os.path.abspath(__file__)),
                  os.path.dirname(os.path.abspath(pydantic.__file__)))


def _caller_stacklevel() -> int:
    """Stack level of the first frame outside pydantic and this package, so a deprecation
    warning points at the code that built the config rather than at validator internals."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_INTERNAL_DIRS):
        frame, level = frame.f_back, level + 1
    return level


class DeepSpeedConfigModel(BaseModel):
    """Base of every config section model (core and plugin)."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        validate_assignment=True,
        validate_default=True,
        arbitrary_types_allowed=True,
        protected_namespaces=(),
        use_enum_values=False,
    )

    # What each documented key does here, read by the key-effect table of the configuration
    # reference (tools/docs/gen_config_reference.py); a key path may reach into a nested
    # section ("offload_optimizer.ratio"). Every key has exactly one entry in one of the three
    # (or in a nested section's own tables); tests/docs/test_key_effects.py fails otherwise.
    #
    # keys that take effect: {key path: "tests/<file>.py::<test>"}, the test that fails when
    # the key stops working
    tested_by: ClassVar[Dict[str, str]] = {}
    # keys accepted without effect in this implementation: {key path: why, what to use
    # instead}; validate_config warns once per process for each one a config sets (see
    # without_effect.py)
    without_effect: ClassVar[Dict[str, str]] = {}
    # keys this build cannot honour: {key path: why, what to use instead}; a value other than
    # the default is a validation error naming the key and the reason (``_refuse_keys``)
    refused: ClassVar[Dict[str, str]] = {}

    # -- introspection used by the validator, the "auto" scan and typo suggestions ----------
    @classmethod
    def deprecated_aliases(cls) -> Dict[str, Tuple[str, DeprecatedAlias]]:
        """old key -> (name of the field that replaced it, its marker)."""
        table = {}
        for name, info in cls.model_fields.items():
            for marker in _deprecations_of(info):
                table[marker.old_name] = (name, marker)
        return table

    @classmethod
    def input_keys(cls) -> Dict[str, str]:
        """Every key a user may write at this level (names and aliases) -> field name."""
        keys = {}
        for name, info in cls.model_fields.items():
            keys[name] = name
            if info.alias:
                keys[info.alias] = name
            if isinstance(info.validation_alias, str):
                keys[info.validation_alias] = name
        return keys

    @classmethod
    def field_for_key(cls, key: str):
        """The FieldInfo a user key addresses (by name, alias or deprecated name), or None."""
        name = cls.input_keys().get(key)
        if name is None and key in cls.deprecated_aliases():
            name = cls.deprecated_aliases()[key][0]
        return cls.model_fields[name] if name is not None else None

    # -- deprecated keys --------------------------------------------------------------------
    @model_validator(mode="before")
    @classmethod
    def _map_deprecated_keys(cls, data: Any) -> Any:
        table = cls.deprecated_aliases()
        if not table or not isinstance(data, Mapping):
            return data
        data = dict(data)
        for old, (new_name, marker) in table.items():
            if old not in data:
                continue
            info = cls.model_fields[new_name]
            new_keys = [k for k in (new_name, info.alias) if k and k in data]
            if new_keys:
                raise PydanticCustomError(
                    "deprecated_with_replacement",
                    "Cannot provide deprecated parameter '{old}' and replacing parameter "
                    "'{new}' together",
                    {"old": old, "new": new_keys[0]})
            warnings.warn(
                f"Config parameter '{old}' is deprecated; use '{info.alias or new_name}' instead",
                ConfigDeprecationWarning, stacklevel=_caller_stacklevel())
            value = data.pop(old)
            data[new_name] = marker.convert(value) if marker.convert else value
        return data

    @model_validator(mode="after")
    def _refuse_keys(self):
        problems = [f"{path}={value!r} is not supported here: {why}"
                    for path, value, why in refused_keys(self)]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # -- output -----------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """Plain nested dict keyed by field names (re-loadable as a config); keys a section
        with `extra="allow"` accepted beyond its fields are kept."""
        out = {name: plain_value(getattr(self, name)) for name in type(self).model_fields}
        out.update((key, plain_value(value)) for key, value in (self.model_extra or {}).items())
        return out


MISSING = object()  # what ``leaf`` answers for a key below an absent optional section


def leaf(model, path: str) -> Tuple[Any, Any]:
    """(value, default) of the dotted `path` below `model`; value is MISSING when a section
    on the way is absent (an omitted optional section sets nothing)."""
    *parents, name = path.split(".")
    for part in parents:
        model = getattr(model, part, None)
        if model is None:
            return MISSING, None
    info = type(model).model_fields.get(name)
    if info is None:
        raise KeyError(f"{type(model).__name__}'s key-effect tables name '{path}', which is no "
                       f"field")
    return getattr(model, name), info.get_default(call_default_factory=True)


def refused_keys(model) -> List[Tuple[str, Any, str]]:
    """(key path, value, why) for every key of `model`'s own ``refused`` table set to a value
    other than its default (nested sections check their own tables as they validate)."""
    found = []
    for path, reason in getattr(type(model), "refused", {}).items():
        value, default = leaf(model, path)
        if value is not MISSING and value != default:
            found.append((path, value, reason))
    return found


def plain_value(value: Any) -> Any:
    """Models, enums and containers as plain dicts/lists/scalars, for printing and re-loading."""
    if isinstance(value, DeepSpeedConfigModel):
        return value.to_dict()
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    return value


def flatten(value: Any, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """Dotted `(key, leaf)` pairs of a nested dict; empty dicts are kept as leaves."""
    if isinstance(value, Mapping) and value:
        for key, sub in value.items():
            yield from flatten(sub, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value
