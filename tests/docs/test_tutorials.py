"""Every tutorial's code runs, as the page shows it.

The input is the documentation itself: each page's fenced blocks marked `<!-- run -->` (or
`file:` / `skip: <reason>`), read by tools/docs/doc_blocks.py, which documents the markers. A
page's python blocks run as one program on the project's warm gloo pool (1 rank, or the ranks its
marker asks for), in a fresh directory holding the page's `file:` blocks; its bash blocks then run
in that directory (the launcher ones start their own processes). Nothing here repeats a page's
code: change the page and this test runs the new code.
"""
import pytest

from docs_paths import DOCS

import doc_blocks
from deepspeed.testing.distributed import run_distributed

TUTORIALS = DOCS / "tutorials"
PAGE_TIMEOUT = 240.0  # seconds for one page's program; pages take 1-15 s on two idle cores


def all_pages():
    return sorted(DOCS.rglob("*.md"))


def runnable_pages():
    return [page for page in all_pages() if doc_blocks.parse(page).runnable]


def page_id(path):
    return str(path.relative_to(DOCS))


def test_block_markers_parse_on_every_page():
    errors = []
    for page in all_pages():
        try:
            doc_blocks.parse(page).ranks()
        except doc_blocks.BlockMarkerError as err:
            errors.append(str(err))
    assert not errors, "\n".join(errors)


def test_every_tutorial_block_is_marked_and_every_tutorial_runs_code():
    problems = []
    for page_path in sorted(TUTORIALS.glob("*.md")):
        if page_path.name == "index.md":
            continue
        page = doc_blocks.parse(page_path)
        for block in page.unmarked():
            problems.append(f"{block.where}: a {block.language} block with no `run`, `file:` or "
                            f"`skip:` marker")
        if not page.runnable:
            problems.append(f"{page_id(page_path)}: no runnable block; a tutorial shows code "
                            f"that runs on CPU")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page_path", runnable_pages(), ids=page_id)
def test_page_code_runs(page_path, tmp_path):
    page = doc_blocks.parse(page_path)
    workdir = doc_blocks.prepare(page, tmp_path)
    program = page.python_program()
    if program:
        run_distributed(doc_blocks.exec_program, world_size=page.ranks(), timeout=PAGE_TIMEOUT,
                        args=(program, str(page_path), str(workdir)), fresh=page.fresh)
    for block in page.shell_commands():
        doc_blocks.run_shell(block, workdir, timeout=PAGE_TIMEOUT * 2)
