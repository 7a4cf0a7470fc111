"""Unambiguous prefixes of the ``deepspeed`` command's own flags (``--num_g 2``), as argparse
accepts them by default, without ever reading the user script's arguments as launcher flags.

argparse's own abbreviation matching (``allow_abbrev=True``) classifies *every* token of the
command line, those after the user script included: a script flag such as ``--num=3`` or
``--master`` is then an "ambiguous option" of the launcher and the whole command fails. So the
runner's parser keeps ``allow_abbrev=False`` and this module expands prefixes itself, only in
the tokens before the user script: it walks the launcher's flags (their values skipped by each
flag's ``nargs``) up to the first positional token, and leaves that token and everything after
it untouched. Flags plugins add (``--autotuning``) are expanded the same way.
"""
import argparse
from typing import List, Sequence


class FlagRecordingParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that keeps the flag actions added to it (``flag_actions``), so the
    prefixes of every flag, plugins' included, can be expanded before parsing."""

    def __init__(self, *args, **kwargs):
        self.flag_actions: List[argparse.Action] = []  # before -h/--help is added
        kwargs["allow_abbrev"] = False  # see the module docstring: prefixes are expanded here
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        if action.option_strings:
            self.flag_actions.append(action)
        return action


def _value_count(action, following: Sequence[str]) -> int:
    """How many of the ``following`` tokens argparse would give ``action`` as its value(s)."""
    nargs = action.nargs
    if nargs == 0:
        return 0
    if nargs is None:
        return min(1, len(following))
    if isinstance(nargs, int):
        return min(nargs, len(following))
    plain = 0  # '?', '*', '+': the tokens up to the next flag
    for token in following:
        if token.startswith("-"):
            break
        plain += 1
    return min(plain, 1) if nargs == argparse.OPTIONAL else plain


def expand_flag_prefixes(argv: Sequence[str], actions: Sequence[argparse.Action]) -> List[str]:
    """``argv`` with each unambiguous prefix of a long flag in ``actions`` written out in full,
    up to the user script. A prefix of flags of two different actions raises ``ValueError``
    naming them; an unknown flag is left for argparse to report."""
    by_option = {option: action for action in actions for option in action.option_strings}
    long_options = sorted(option for option in by_option if option.startswith("--"))
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        if token == "--" or token == "-" or not token.startswith("-"):
            break  # the user script (or argparse's end of options): the rest is the user's
        flag, equals, value = token.partition("=")
        if flag.startswith("--") and flag not in by_option:
            matches = [option for option in long_options if option.startswith(flag)]
            if len({id(by_option[m]) for m in matches}) > 1:
                raise ValueError(f"ambiguous option: {flag} could match {', '.join(matches)}")
            if matches:
                flag = matches[0]
        out.append(flag + equals + value)
        i += 1
        action = by_option.get(flag)
        if action is not None and not equals:
            taken = _value_count(action, argv[i:])
            out.extend(argv[i:i + taken])
            i += taken
    return out + list(argv[i:])
