"""List the dotted `deepspeed.*` names that the DeepSpeed documentation (the spec) names.

    python tools/spec/extract_names.py [SEEDS_DIR] [--output FILE] [--check]

Reads the plain-text copies of the documentation pages in SEEDS_DIR (every `*.txt`; default
`docs/dev/spec`, the copies vendored in this repository: the API reference, the tutorials, the
Hugging Face integration guides) and writes every name they contain, sorted, to FILE (default
`tests/docs/spec_api_names.txt`): every dotted `deepspeed.x.y` in the text, and every entry of
the API reference's index ("initialize() (in module deepspeed)", "step()
(deepspeed.runtime.pipe.engine.PipelineEngine method)", ...) as the full path it describes.
Hyphenation left by PDF-to-text ("deep-speed.", "deep- speed.") is undone. Web addresses
(www.deepspeed.ai) are not names.

FILE keeps its header and, for each name still found, the `# unresolved: <why>` note it had:
the docs tests (tests/docs/test_docs_site_build.py) check that every listed name resolves after
a plain `import deepspeed` and is documented by the API reference, unless its note says why it
cannot (a typo or a truncation in the source text). A name new to the spec is listed without a
note, so the tests then fail until it resolves or is explained. `--check` writes nothing and
exits 1 when FILE's names differ from the spec's (what tests/docs/test_spec_names.py asserts).
"""
import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT / "docs" / "dev" / "spec"
NAMES_FILE = ROOT / "tests" / "docs" / "spec_api_names.txt"

_HYPHENATED = re.compile(r"deep-\s*speed\.\s*")
_TAGS = re.compile(r"</?code>|[`*]")
_DOTTED = re.compile(r"(?<![\w/.])deepspeed(?:\.[A-Za-z_]\w*)+")
# index entries: "<name>[()] (<kind> <owner>)" or "<name>[()] (<owner> <kind>)"
_INDEX_OWNER_FIRST = re.compile(
    r"\b([A-Za-z_]\w*)(?:\(\))?\s*\(\s*(?:class in|in module|in)\s+(deepspeed[\w.]*)\s*\)")
_INDEX_OWNER_LAST = re.compile(
    r"\b([A-Za-z_]\w*)(?:\(\))?\s*\(\s*(deepspeed[\w.]*)\s+(?:method|attribute|property)\s*\)")
_NOTE = "# unresolved:"


def names_in(text: str) -> set:
    """Every dotted `deepspeed.` name in one page's text."""
    text = _TAGS.sub("", _HYPHENATED.sub("deepspeed.", text))
    found = {name.rstrip(".") for name in _DOTTED.findall(text)}
    for pattern in (_INDEX_OWNER_FIRST, _INDEX_OWNER_LAST):
        for name, owner in pattern.findall(text):
            found.add(f"{owner.rstrip('.')}.{name}")
    return {name for name in found if not name.startswith("deepspeed.ai")}


def spec_names(seeds=SEEDS) -> list:
    """The sorted names of every `*.txt` page in the folder `seeds`."""
    pages = sorted(Path(seeds).glob("*.txt"))
    if not pages:
        raise FileNotFoundError(f"no *.txt spec pages in '{seeds}'")
    found = set()
    for page in pages:
        found |= names_in(page.read_text(encoding="utf-8"))
    return sorted(found)


def read_list(path=NAMES_FILE):
    """(header lines, {name: note or ''}) of a names file."""
    header, notes = [], {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or (not line.strip() and not notes):
            if not notes:
                header.append(line)
            continue
        name, _, note = line.partition("#")
        if name.strip():
            notes[name.strip()] = f"#{note}".strip() if note else ""
    return header, notes


def render(names, header, notes) -> str:
    lines = list(header)
    for name in names:
        note = notes.get(name, "")
        lines.append(f"{name}  {note}" if note else name)
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seeds", nargs="?", default=str(SEEDS), help="folder of *.txt pages")
    parser.add_argument("--output", default=str(NAMES_FILE), help="the names file to update")
    parser.add_argument("--check", action="store_true", help="compare only, write nothing")
    args = parser.parse_args(argv)
    names = spec_names(args.seeds)
    header, notes = read_list(args.output)
    if args.check:
        added = sorted(set(names) - set(notes))
        gone = sorted(set(notes) - set(names))
        for name in added:
            print(f"new in the spec: {name}")
        for name in gone:
            print(f"no longer in the spec: {name}")
        return 1 if added or gone else 0
    Path(args.output).write_text(render(names, header, notes), encoding="utf-8")
    print(f"{len(names)} names written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
