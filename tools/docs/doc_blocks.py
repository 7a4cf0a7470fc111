"""The code blocks of a documentation page, and running the ones a page marks as runnable.

A page marks a fenced code block with an HTML comment on the line just above its fence (the
comment is invisible in the rendered site):

    <!-- run -->                 run this block (python: in the page's program; bash: a command)
    <!-- run: ranks=2 -->        the page's python program runs on 2 ranks (gloo, CPU)
    <!-- run: ranks=2 fresh -->  ... in new processes, for a page whose code changes process-wide
                                 state (a library's global registry) that later pages must not see
    <!-- file: ds_config.json --> write this block to that file before anything runs
    <!-- skip: <reason> -->       do not run this block; the reason is required

How a page runs (tests/docs/test_tutorials.py, or `python tools/docs/doc_blocks.py PAGE.md`):

1. Every `file:` block is written into a fresh working directory.
2. The page's `run` python blocks, in page order, form one program that runs in that
   directory, like the cells of a notebook: a later block sees the names an earlier one defined.
   Line numbers in its tracebacks are the page's own. It runs on 1 rank, or on as many ranks as
   a `ranks=` marker asks (every rank runs the whole program, as under the launcher), on the
   test helper's warm process pool unless a marker says `fresh`.
3. The page's `run` bash blocks run after it, one by one, in that directory, with the
   interpreter's `bin/` first on PATH (so `deepspeed`, `ds_report` are this install's).

Python and bash blocks without a marker are fine on other pages, but every tutorial's python and
bash blocks must say `run`, `file:` or `skip:` (the test checks), so no tutorial code is untested
by accident.
"""
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>run|file|skip)\s*(?::\s*(?P<arg>.*?))?\s*-->\s*$")
CHECKED_LANGUAGES = ("python", "py", "bash", "sh", "shell", "console")
PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell")


class BlockMarkerError(ValueError):
    """A marker that cannot be honoured (bad syntax, missing reason, conflicting ranks)."""


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the first code line
    language: str
    code: str
    kind: Optional[str] = None  # "run", "file", "skip" or None
    arg: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Page:
    path: Path
    blocks: List[Block] = field(default_factory=list)

    @property
    def runnable(self) -> bool:
        return any(b.kind == "run" for b in self.blocks)

    def python_program(self) -> str:
        """The page's runnable python blocks as one program whose line numbers are the page's."""
        lines: List[str] = []
        for block in self.blocks:
            if block.kind == "run" and block.language in PYTHON:
                lines.extend([""] * (block.line - 1 - len(lines)))
                lines.extend(block.code.splitlines())
        return "\n".join(lines) + "\n" if lines else ""

    def _python_run_options(self):
        for block in self.blocks:
            if block.kind == "run" and block.language in PYTHON:
                match = re.fullmatch(r"(?:ranks=(\d+))?\s*(fresh)?", block.arg or "")
                if match is None:
                    raise BlockMarkerError(
                        f"{block.where}: unknown run option {block.arg!r} "
                        f"(allowed: `run`, `run: ranks=N`, `run: ranks=N fresh`)")
                yield int(match.group(1) or 1), bool(match.group(2))

    @property
    def fresh(self) -> bool:
        """Whether the program needs processes of its own (see the module docstring)."""
        return any(fresh for _, fresh in self._python_run_options())

    def ranks(self) -> int:
        found = {ranks for ranks, _ in self._python_run_options()}
        if len(found) > 1:
            raise BlockMarkerError(f"{self.path}: its python blocks ask for different rank "
                                   f"counts {sorted(found)}; one program runs on one world size")
        return found.pop() if found else 1

    def shell_commands(self) -> List[Block]:
        return [b for b in self.blocks if b.kind == "run" and b.language in SHELL]

    def files(self) -> List[Block]:
        return [b for b in self.blocks if b.kind == "file"]

    def unmarked(self) -> List[Block]:
        return [b for b in self.blocks if b.kind is None and b.language in CHECKED_LANGUAGES]


def parse(path) -> Page:
    """The fenced code blocks of a markdown page, each with the marker above it (if any)."""
    path = Path(path)
    page = Page(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        fence, indent = match.group("fence"), match.group("indent")
        language = (match.group("info").split() or [""])[0].lstrip("{.").rstrip("}").lower()
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if end == len(lines):
            raise BlockMarkerError(f"{path}:{index + 1}: code fence is never closed")
        code = textwrap.dedent("\n".join(
            line[len(indent):] if line.startswith(indent) else line
            for line in lines[index + 1:end]))
        block = Block(path, index + 2, language, code)
        marker = MARKER.match(lines[index - 1]) if index > 0 else None
        if marker is not None:
            block.kind, block.arg = marker.group("kind"), (marker.group("arg") or "").strip()
        elif index > 0 and "<!--" in lines[index - 1] and re.search(r"\b(run|file|skip)\b",
                                                                      lines[index - 1]):
            raise BlockMarkerError(f"{path}:{index}: malformed block marker "
                                   f"{lines[index - 1].strip()!r}")
        _check(block)
        page.blocks.append(block)
        index = end + 1
    return page


def _check(block: Block) -> None:
    if block.kind == "skip" and len(block.arg) < 10:
        raise BlockMarkerError(f"{block.where}: `skip:` needs a reason a reader understands, "
                               f"got {block.arg!r}")
    if block.kind == "file" and (not block.arg or "/" in block.arg.strip("./")
                                 or block.arg.startswith((".", "/"))):
        raise BlockMarkerError(f"{block.where}: `file:` needs a plain file name, got "
                               f"{block.arg!r}")
    if block.kind == "run" and block.language not in PYTHON + SHELL:
        raise BlockMarkerError(f"{block.where}: only python and bash blocks can `run`, this "
                               f"one is {block.language or 'unlabelled'!r}")


# ------------------------------------------------------------------------------ running
def exec_program(source: str, filename: str, workdir: str) -> None:
    """Run a page's program in `workdir` as `__main__` (on a rank of the test helper's pool)."""
    previous = os.getcwd()
    os.chdir(workdir)
    sys.path.insert(0, workdir)
    try:
        code = compile(source, filename, "exec")
        exec(code, {"__name__": "__main__", "__file__": filename})  # noqa: S102  (the page's code)
    finally:
        sys.path.remove(workdir)
        os.chdir(previous)


def prepare(page: Page, workdir) -> Path:
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for block in page.files():
        (workdir / block.arg).write_text(block.code, encoding="utf-8")
    return workdir


def shell_environment() -> dict:
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_shell(block: Block, workdir, timeout: float) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=workdir,
                            env=shell_environment(), capture_output=True, text=True,
                            timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{block.where}: the command exited with {result.returncode}\n"
                             f"$ {block.code}\n--- stdout ---\n{result.stdout[-4000:]}\n"
                             f"--- stderr ---\n{result.stderr[-4000:]}")
    return result


def run_page(path, workdir=None, timeout: float = 180.0) -> None:
    """Run a page's blocks as the docs test does, on this machine (for writers)."""
    from deepspeed.testing.distributed import run_distributed

    page = parse(path)
    workdir = prepare(page, workdir or tempfile.mkdtemp(prefix="ds-doc-page-"))
    program = page.python_program()
    if program:
        run_distributed(exec_program, world_size=page.ranks(), timeout=timeout,
                        args=(program, str(page.path), str(workdir)), fresh=page.fresh)
    for block in page.shell_commands():
        print(run_shell(block, workdir, timeout).stdout, end="")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for page_path in sys.argv[1:]:
        run_page(page_path)
        print(f"{page_path}: ok")
