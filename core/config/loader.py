"""Turn whatever the user passed as a config (dict, file path, base64 string) into a plain dict.

Parsing is strict JSON first and HJSON second: the DeepSpeed and HF docs print several config
blocks with trailing commas (and one with a `//` comment) that users paste verbatim, so those must
load, but a document that is valid JSON is read exactly as JSON (HJSON would, for instance, turn
`1.0` into the int `1`). Duplicate keys are rejected in both modes because the last one silently
winning is how half-edited configs train with the wrong settings.
"""
import base64
import binascii
import copy
import json
import os
import re
from collections.abc import Mapping
from typing import Any, Dict, List, Tuple

import hjson

from deepspeed.config.errors import DeepSpeedConfigError, format_path

_BASE64_RE = re.compile(r"^[A-Za-z0-9+/_-]+={0,2}$")
BASE64_SOURCE_NAME = "<base64 config string>"


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _reject_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    seen: Dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def parse_config_text(text: str, source_name: str) -> Dict[str, Any]:
    """Parse a JSON/HJSON document; every failure names `source_name`, line and column."""
    if not text.strip():
        raise DeepSpeedConfigError("the config document is empty", source=source_name)
    try:
        try:
            parsed = json.loads(text, object_pairs_hook=_reject_duplicates)
        except json.JSONDecodeError as json_error:
            parsed = _parse_hjson_fallback(text, source_name, json_error)
    except _DuplicateKey as dup:
        raise DeepSpeedConfigError(
            f"duplicate key '{dup.key}': a key may appear only once in each object",
            source=source_name) from None
    if not isinstance(parsed, dict):
        raise DeepSpeedConfigError(
            f"the top level must be a JSON object ({{...}}), got {type(parsed).__name__}",
            source=source_name)
    return parsed


def _parse_hjson_fallback(text: str, source_name: str, json_error: json.JSONDecodeError):
    try:
        return hjson.loads(text, object_pairs_hook=_reject_duplicates)
    except hjson.HjsonDecodeError as hjson_error:
        # Report whichever parser got further: a JSON error on a trailing comma that HJSON
        # accepts says nothing about the real mistake further down.
        best = hjson_error if hjson_error.pos > json_error.pos else json_error
        raise DeepSpeedConfigError(
            f"malformed JSON at line {best.lineno} column {best.colno}: {best.msg}",
            source=source_name) from None


def _check_keys_are_strings(value: Any, path: list) -> None:
    if isinstance(value, Mapping):
        for key, sub in value.items():
            if not isinstance(key, str):
                raise DeepSpeedConfigError(
                    f"{format_path(path + [repr(key)])}: config keys must be strings, "
                    f"got {type(key).__name__}")
            _check_keys_are_strings(sub, path + [key])
    elif isinstance(value, (list, tuple)):
        for index, sub in enumerate(value):
            _check_keys_are_strings(sub, path + [index])


def _plain(value: Any) -> Any:
    """Deep copy into plain dicts/lists so later mutation never reaches the caller's objects."""
    if isinstance(value, Mapping):
        return {key: _plain(sub) for key, sub in value.items()}
    if isinstance(value, list):
        return [_plain(sub) for sub in value]
    return copy.deepcopy(value)


def _try_base64(text: str):
    """Decode a base64 JSON config, or return None when `text` is not one.

    Returns None (so the caller reports a missing path) unless the decoded bytes clearly are a
    JSON object; a decoded `{...}` that fails to parse is reported as a parse error.
    """
    stripped = text.strip()
    if not _BASE64_RE.match(stripped):
        return None
    padded = stripped + "=" * (-len(stripped) % 4)
    try:
        raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
        decoded = raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    if not decoded.lstrip().startswith("{"):
        return None
    return parse_config_text(decoded, BASE64_SOURCE_NAME)


def describe_source(source: Any) -> str:
    """The name used for `source` in error messages: its path, or None for in-memory configs."""
    if isinstance(source, (str, os.PathLike)) and os.path.exists(os.fspath(source)):
        return os.fspath(source)
    return None


def load_config_source(source: Any) -> Dict[str, Any]:
    """Return the user's config as a fresh plain dict.

    `source` is a dict (deep-copied), a path (str or PathLike) to a JSON/HJSON file, or a
    standard or URL-safe base64 string of a JSON document.
    """
    if isinstance(source, Mapping):
        _check_keys_are_strings(source, [])
        return _plain(source)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if os.path.isdir(path):
            raise DeepSpeedConfigError(f"config path '{path}' is a directory, not a JSON file")
        if os.path.isfile(path):
            with open(path, "r", encoding="utf-8") as handle:
                return parse_config_text(handle.read(), path)
        if isinstance(source, str):
            decoded = _try_base64(source)
            if decoded is not None:
                return decoded
        raise DeepSpeedConfigError(
            f"config file path '{path}' does not exist (and it is not a base64-encoded JSON "
            f"config either); pass an existing JSON file, a dict, or a base64 JSON string")
    raise DeepSpeedConfigError(
        f"a config must be a dict, a path to a JSON file, or a base64 JSON string; "
        f"got {type(source).__name__}")
