"""The README is a short front door: at most ~150 lines, the two commands CI and the demo run,
install notes for CUDA users, a training loop, and links into the documentation site that
resolve inside the repository."""
import re

from docs_paths import ROOT

README = ROOT / "README.md"
DEMO_COMMAND = ("python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e . && "
                ".venv/bin/deepspeed --num_gpus 2 examples/train_demo.py")
TEST_COMMAND = ("python3 -m venv .venv && .venv/bin/pip install -qq -c constraints.txt -U pip && "
                ".venv/bin/pip install -qq --no-compile -c constraints.txt -e '.[dev]' && "
                ".venv/bin/python -m pytest")


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_keeps_the_two_commands_verbatim():
    text = README.read_text(encoding="utf-8")
    assert DEMO_COMMAND in text
    assert TEST_COMMAND in text
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_links_resolve_inside_the_repository():
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+://", t)]
    assert any(t.startswith("docs/") for t in local), "the README should link into docs/"
    broken = [t for t in local if t and not (
        (ROOT / t).resolve().is_relative_to(ROOT) and (ROOT / t).exists())]
    assert not broken, f"README links that do not resolve inside the repository: {broken}"
