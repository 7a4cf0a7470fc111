"""Validate a loaded config dict against the core model plus the plugin-contributed sections.

All problems found in one pass (unknown keys, leftover "auto", type errors in any section) are
reported together in one `DeepSpeedConfigError`, each with its full key path, so that a user fixes
a config in one round trip. Documented keys that are accepted but have no effect here are reported
once per process, as a warning (see without_effect.py).
"""
from typing import Any, Dict, List, Mapping, Optional, Tuple

from pydantic import BaseModel, TypeAdapter, ValidationError

from deepspeed.config.core_sections import CoreConfig
from deepspeed.config.errors import DeepSpeedConfigError, format_path, unknown_key_problem
from deepspeed.config.feature_sections import FEATURE_SECTIONS, missing_plugin_problem
from deepspeed.config.model import (AUTO, DeepSpeedConfigModel, accepts_auto, annotation_has_auto,
                                    container_item_annotation, is_union, model_classes_in)
from deepspeed.config.without_effect import warn_without_effect

AUTO_NOTE = ('"auto" is only a placeholder: integrations such as the Hugging Face Trainer / '
             'Accelerate (HfDeepSpeedConfig) replace it with real values before DeepSpeed sees the '
             'config. When calling deepspeed.initialize directly, give concrete values instead.')


def _field_info(model_cls, key: str):
    if isinstance(model_cls, type) and issubclass(model_cls, DeepSpeedConfigModel):
        return model_cls.field_for_key(key)
    return model_cls.model_fields.get(key)


def _known_keys(model_cls) -> List[str]:
    if issubclass(model_cls, DeepSpeedConfigModel):
        return list(model_cls.input_keys())
    return list(model_cls.model_fields)


# -- leftover "auto" ----------------------------------------------------------------------------
def _strip_auto(value: Any, annotation: Any, path: list, found: List[str]) -> Any:
    """Return `value` without the "auto" leaves that sit where a model field expects a value,
    recording every leftover "auto" path in `found`. "auto" inside free-form dicts/lists
    (optimizer params) is recorded but kept, since `Any` would accept it."""
    models = model_classes_in(annotation) if annotation is not None else []
    if isinstance(value, dict):
        if models:
            kept = {}
            for key, sub in value.items():
                info = _field_info(models[0], key)
                if info is None and models[0].model_config.get("extra") == "allow":
                    kept[key] = _strip_auto_item(sub, None, path + [key], found)
                elif info is None:  # unknown key: reported by validation, not scanned
                    kept[key] = sub
                elif isinstance(sub, str) and sub == AUTO and not accepts_auto(info):
                    found.append(format_path(path + [key]))
                else:
                    kept[key] = _strip_auto(sub, info.annotation, path + [key], found)
            return kept
        item = container_item_annotation(annotation) if annotation is not None else None
        return {key: _strip_auto_item(sub, item, path + [key], found) for key, sub in value.items()}
    if isinstance(value, list):
        item = container_item_annotation(annotation) if annotation is not None else None
        return [_strip_auto_item(sub, item, path + [i], found) for i, sub in enumerate(value)]
    return value


def _strip_auto_item(value, annotation, path, found):
    if isinstance(value, str) and value == AUTO:
        if annotation is None or not annotation_has_auto(annotation):
            found.append(format_path(path))
        return value
    return _strip_auto(value, annotation, path, found)


# -- pydantic errors -> messages ------------------------------------------------------------------
def _walk_loc(annotation, loc) -> Tuple[list, Any]:
    """Map a pydantic error `loc` onto the user's key path, dropping union-member tags, and
    return the annotation found at its end (to list the keys allowed there)."""
    path: list = []
    for part in loc:
        if isinstance(part, int):
            path.append(part)
            annotation = container_item_annotation(annotation) if annotation is not None else None
            continue
        models = model_classes_in(annotation) if annotation is not None else []
        if models:
            tagged = [m for m in models if m.__name__ == part]
            info = _field_info(models[0], part)
            if info is None and tagged:
                annotation = tagged[0]
                continue
            path.append(part)
            annotation = info.annotation if info is not None else None
            continue
        item = container_item_annotation(annotation) if annotation is not None else None
        if item is not None:
            path.append(part)
            annotation = item
        elif annotation is not None and is_union(annotation):
            continue  # a union-member tag such as "int" or "literal['auto']"
        else:
            path.append(part)
            annotation = None
    return path, annotation


def _message(error: dict, root_annotation, prefix: list) -> str:
    path, _ = _walk_loc(root_annotation, error["loc"])
    full = prefix + path
    if error["type"] == "extra_forbidden":
        _, parent = _walk_loc(root_annotation, error["loc"][:-1])
        parents = model_classes_in(parent) if parent is not None else []
        return unknown_key_problem(full, _known_keys(parents[0]) if parents else [])
    msg = error["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if error["type"] == "missing":
        msg = "required key is missing"
    where = f"{format_path(full)}: " if full else ""
    value = error.get("input")
    # the value once: a section's own validator may already say "..., got 4"
    shown = "" if isinstance(value, (dict, list)) or error["type"] == "missing" \
        or f"got {value!r}" in msg else f" (got {value!r})"
    return f"{where}{msg}{shown}"


def _validate(section_type, value, prefix: list, problems: List[str]):
    try:
        if isinstance(section_type, type) and issubclass(section_type, BaseModel):
            return section_type.model_validate(value)
        return TypeAdapter(section_type).validate_python(value)
    except ValidationError as exc:
        problems.extend(_message(err, section_type, prefix) for err in exc.errors())
        return None


# -- entry point ----------------------------------------------------------------------------------
def check_sections(sections: Mapping[str, Any]) -> Dict[str, Any]:
    """Reject plugin section tables that would shadow a core key (a plugin bug, not a user one)."""
    core_keys = set(CoreConfig.input_keys()) | set(CoreConfig.deprecated_aliases())
    checked = {}
    for key, section_type in dict(sections or {}).items():
        if not isinstance(key, str):
            raise TypeError(f"config section keys must be strings, got {key!r}")
        if key in core_keys:
            raise ValueError(f"plugin config section '{key}' collides with the core config key '{key}'")
        checked[key] = section_type
    return checked


def validate_config(raw: Dict[str, Any], sections: Dict[str, Any],
                    source: Optional[str] = None) -> Tuple[CoreConfig, Dict[str, Any]]:
    """Return (core model, {plugin key: validated section}) or raise one DeepSpeedConfigError."""
    core_keys = CoreConfig.input_keys()
    deprecated = CoreConfig.deprecated_aliases()
    problems: List[str] = []
    autos: List[str] = []
    core_data: Dict[str, Any] = {}
    plugin_data: Dict[str, Any] = {}
    known_top = list(core_keys) + list(sections) + list(FEATURE_SECTIONS)

    for key, value in raw.items():
        if key in core_keys or key in deprecated:
            core_data[key] = value
        elif key in sections:
            plugin_data[key] = value
        elif key in FEATURE_SECTIONS:
            problems.append(missing_plugin_problem(key))
        else:
            problems.append(unknown_key_problem([key], known_top))

    core_data = _strip_auto(core_data, CoreConfig, [], autos)
    for key in list(plugin_data):
        value = plugin_data[key]
        if isinstance(value, str) and value == AUTO and not annotation_has_auto(sections[key]):
            autos.append(key)
            del plugin_data[key]
        else:
            plugin_data[key] = _strip_auto(value, sections[key], [key], autos)
    problems.extend(f"{path}: still set to \"auto\"" for path in autos)

    core = _validate(CoreConfig, core_data, [], problems)
    plugins = {key: _validate(sections[key], value, [key], problems)
               for key, value in plugin_data.items()}
    if problems:
        raise DeepSpeedConfigError(problems, source=source, note=AUTO_NOTE if autos else None)
    warn_without_effect(core)
    for key, section in plugins.items():
        if isinstance(section, DeepSpeedConfigModel):
            warn_without_effect(section, key)
    return core, plugins

