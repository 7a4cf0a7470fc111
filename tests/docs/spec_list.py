"""The list of the spec's dotted names (tests/docs/spec_api_names.txt) and how a name resolves,
shared by test_spec_names.py and test_docs_site_build.py. Imports nothing of deepspeed until
asked to resolve, so a fresh interpreter can run ``resolution()`` right after
``import deepspeed``."""
import importlib
from pathlib import Path

NAMES_FILE = Path(__file__).resolve().parent / "spec_api_names.txt"


def spec_names():
    """(name, reason it does not resolve or None) for every name of spec_api_names.txt."""
    found = []
    for line in NAMES_FILE.read_text(encoding="utf-8").splitlines():
        name, _, note = line.partition("#")
        name = name.strip()
        if name:
            reason = note.split("unresolved:", 1)[1].strip() if "unresolved:" in note else None
            found.append((name, reason))
    return found


def resolve(name):
    """The object a dotted name denotes, reached as a user's script does after a plain
    ``import deepspeed``: attribute by attribute from the package (a last part that is a
    pydantic config model's field resolves to that field). Raises AttributeError."""
    parts = name.split(".")
    obj = importlib.import_module(parts[0])
    for index, part in enumerate(parts[1:], start=1):
        fields = getattr(obj, "model_fields", None)
        if index == len(parts) - 1 and isinstance(fields, dict) and part in fields:
            return fields[part]
        obj = getattr(obj, part)
    return obj


def resolution():
    """{name: None when it resolves, else the error} for every listed name."""
    report = {}
    for name, _ in spec_names():
        try:
            resolve(name)
            report[name] = None
        except (ImportError, AttributeError) as err:
            report[name] = f"{type(err).__name__}: {err}"
    return report
