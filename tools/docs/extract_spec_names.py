"""List the dotted `deepspeed.*` names that the DeepSpeed documentation (the spec) names.

    python tools/docs/extract_spec_names.py SPEC_PAGE.txt [...] > names.txt

Reads plain-text copies of the documentation pages (the API reference, the tutorials, the
Hugging Face integration guides) and prints one name per line, sorted: every dotted
`deepspeed.x.y` in the text, and every entry of the API reference's index ("initialize() (in
module deepspeed)", "step() (deepspeed.runtime.pipe.engine.PipelineEngine method)", ...) as
the full path it describes. Hyphenation left by PDF-to-text ("deep-speed.", "deep- speed.") is
undone. Web addresses (www.deepspeed.ai) are not names. The output is the input of
tests/docs/spec_api_names.txt, where each name is either documented by the API reference or
listed with the reason it does not resolve.
"""
import re
import sys

_HYPHENATED = re.compile(r"deep-\s*speed\.\s*")
_TAGS = re.compile(r"</?code>|[`*]")
_DOTTED = re.compile(r"(?<![\w/.])deepspeed(?:\.[A-Za-z_]\w*)+")
# index entries: "<name>[()] (<kind> <owner>)" or "<name>[()] (<owner> <kind>)"
_INDEX_OWNER_FIRST = re.compile(
    r"\b([A-Za-z_]\w*)(?:\(\))?\s*\(\s*(?:class in|in module|in)\s+(deepspeed[\w.]*)\s*\)")
_INDEX_OWNER_LAST = re.compile(
    r"\b([A-Za-z_]\w*)(?:\(\))?\s*\(\s*(deepspeed[\w.]*)\s+(?:method|attribute|property)\s*\)")


def names_in(text: str) -> set:
    text = _TAGS.sub("", _HYPHENATED.sub("deepspeed.", text))
    found = {name.rstrip(".") for name in _DOTTED.findall(text)}
    for pattern in (_INDEX_OWNER_FIRST, _INDEX_OWNER_LAST):
        for name, owner in pattern.findall(text):
            found.add(f"{owner.rstrip('.')}.{name}")
    return {name for name in found if not name.startswith("deepspeed.ai")}


def main(paths):
    found = set()
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            found |= names_in(handle.read())
    print("\n".join(sorted(found)))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
