"""No committed file points outside the repository or at this machine: no path into the
development workspace, no sibling checkout of the spec next to the repository, no home
directories, no test or job scratch folders of one machine (the patterns are LOCAL_PATH below).
A user's clone has none of them."""
import re
import subprocess

import pytest

from docs_paths import ROOT

LOCAL_PATH = re.compile(
    r"/work/"                       # the development workspace
    r"|\.\./shared\b|\bshared/spec\b"  # the spec checkout next to the repository
    r"|/home/[a-z_][\w-]*/|/root/|/Users/\w"  # someone's home directory
    r"|/tmp/pytest-of-|/tmp/bash_jobs|/tmp/tmp\w{8}"  # one machine's scratch folders
)
THIS_FILE = "tests/docs/test_no_local_paths.py"
# verbatim copies of the spec's pages (docs/dev/spec): the text they quote, not a path of ours
QUOTED = {"docs/dev/spec/001_819f6776ec59227d.txt":
          "/home/docs/checkouts/readthedocs.org/"}  # Read the Docs' build folder, in a repr


def tracked_files():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if out.returncode != 0:
        pytest.skip(f"not a git checkout, no list of committed files: {out.stderr.decode()[:200]}")
    return [name for name in out.stdout.decode().split("\0") if name and name != THIS_FILE]


def test_no_tracked_file_names_a_local_path():
    found = []
    for name in tracked_files():
        path = ROOT / name
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files, and files deleted in the working tree
        for number, line in enumerate(text.splitlines(), 1):
            if name in QUOTED:
                line = line.replace(QUOTED[name], "")
            if LOCAL_PATH.search(line):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not found, "local paths in committed files:\n" + "\n".join(found)
