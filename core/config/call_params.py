"""Checking a section's free-form ``params`` against the constructor they are handed to.

``optimizer.params`` and ``scheduler.params`` are not pydantic models: their keys are whatever
the chosen class accepts. Passed on unchecked, a typo or a quoted number surfaces as a bare
``TypeError`` from deep inside the class (``'<=' not supported between 'float' and 'str'``),
with no key path. So the keys are checked against the constructor's signature first (unknown
keys get the closest valid name), and each value against what the parameter's default (or its
annotation) says it holds: a number, a flag, a string, or a fixed-length list of numbers. Values
the signature says nothing about are left to the class.
"""
import inspect
import numbers
import typing
from typing import Any, Dict, List, Mapping, Optional, Sequence

from deepspeed.config.errors import closest_key, format_path


def _parameters(target, skip: int) -> List[inspect.Parameter]:
    """The parameters a config may set: keyword-capable ones after the first ``skip``
    positional ones (the parameters / optimizer the caller passes itself)."""
    parameters = list(inspect.signature(target).parameters.values())
    return parameters[skip:]


def _plain(annotation):
    """``Optional[X]`` -> X; the annotation itself when it is a plain type; else None."""
    if isinstance(annotation, str) or annotation is inspect.Parameter.empty:
        return None
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Union and len(args) == 1:
        annotation = args[0]
    return annotation if annotation in (bool, int, float, str) else None


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _number_problem(where: str, value, default) -> Optional[str]:
    if _is_number(value):
        return None
    example = f" (the default is {default!r})" if _is_number(default) else ""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return f"{where}: expected a number{example}, got {value!r}, which is not a number"
        return (f"{where}: expected a number{example}, got the string {value!r}; write it "
                f"without quotes")
    return f"{where}: expected a number{example}, got {value!r}"


def _value_problems(where: str, value: Any, default: Any, annotation) -> List[str]:
    kind = _plain(annotation)
    if isinstance(default, bool) or (default is None and kind is bool):
        if isinstance(value, bool):
            return []
        return [f"{where}: expected true or false, got {value!r}"]
    if _is_number(default) or (default is None and kind in (int, float)):
        problem = _number_problem(where, value, default)
        return [problem] if problem else []
    if isinstance(default, str) or (default is None and kind is str):
        return [] if isinstance(value, str) else [f"{where}: expected a string, got {value!r}"]
    if isinstance(default, (tuple, list)) and default and all(map(_is_number, default)):
        if not isinstance(value, (list, tuple)):
            return [f"{where}: expected a list of {len(default)} numbers like "
                    f"{list(default)}, got {value!r}"]
        if len(value) != len(default):
            return [f"{where}: expected {len(default)} numbers like {list(default)}, got "
                    f"{len(value)}: {list(value)!r}"]
        found = (_number_problem(f"{where}[{i}]", item, default[i])
                 for i, item in enumerate(value))
        return [problem for problem in found if problem]
    return []


def _unknown_problem(where: str, key: str, named, owner: str) -> str:
    takes = ", ".join(named) or "nothing"
    guess = closest_key(key, named)
    if guess is not None:
        return f"{where}: not a parameter of {owner}; did you mean '{guess}'? (it takes: {takes})"
    return f"{where}: not a parameter of {owner}, which takes: {takes}"


def check_call_params(target, params: Mapping[str, Any], path: Sequence, owner: str,
                      skip: int = 1, require: bool = False) -> List[str]:
    """Problems (one line each, with the key path under ``path``) of passing ``params`` as
    keyword arguments to ``target`` (a class or function) after ``skip`` positional arguments.
    ``require``: also report parameters without a default that ``params`` lacks."""
    parameters = _parameters(target, skip)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
    named: Dict[str, inspect.Parameter] = {
        p.name: p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    problems = []
    for key, value in params.items():
        parameter = named.get(key)
        if parameter is None:
            if not takes_any:
                problems.append(_unknown_problem(format_path(list(path) + [key]), key, named,
                                                 owner))
            continue
        default = None if parameter.default is parameter.empty else parameter.default
        problems += _value_problems(format_path(list(path) + [key]), value, default,
                                    parameter.annotation)
    if require:
        problems += [f"{format_path(list(path) + [name])}: required by {owner} but missing"
                     for name, p in named.items() if p.default is p.empty and name not in params]
    return problems
