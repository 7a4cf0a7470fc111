"""The commit and branch a package was built from, read from its git checkout.

Standard library only: ``setup.py`` loads this file by path (the package is not installed yet
when it builds) to record them in the wheel as ``deepspeed/git_version_info_installed.py``, and
``deepspeed.git_version_info`` reads that record, else the checkout an editable install runs
from. Nothing is guessed: without a checkout or ``git`` both are ``"unknown"``.
"""
import os
import subprocess

UNKNOWN = "unknown"
#: the module ``setup.py`` writes into a built package (``deepspeed.<name>``)
INSTALLED_MODULE = "git_version_info_installed"


def checkout_info(root):
    """``(short commit hash, branch)`` of the git checkout at ``root`` (``.git`` is a folder,
    or a file in a worktree), or ``("unknown", "unknown")``. A detached HEAD's branch is
    ``"HEAD"``, as ``git rev-parse --abbrev-ref`` says."""
    if not os.path.exists(os.path.join(root, ".git")):
        return UNKNOWN, UNKNOWN

    def ask(*args):
        return subprocess.run(["git", "-C", root, "rev-parse", *args], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()

    try:
        return ask("--short", "HEAD"), ask("--abbrev-ref", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN, UNKNOWN


def write_installed_module(path, root):
    """Write the module recording ``checkout_info(root)`` to ``path`` (at build time)."""
    git_hash, git_branch = checkout_info(root)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f'"""Written by setup.py when this package was built."""\n'
                     f"git_hash = {git_hash!r}\ngit_branch = {git_branch!r}\n")
    return git_hash, git_branch
