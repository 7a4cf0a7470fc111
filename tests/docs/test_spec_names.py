"""Every dotted `deepspeed.*` name of the spec resolves, as a user's script reaches it.

The spec is the DeepSpeed documentation vendored in docs/dev/spec; its names are listed in
tests/docs/spec_api_names.txt, which tools/spec/extract_names.py writes. The first test extracts
them again, so a page added to the spec (or a name added to a page) is checked too; the second
resolves each in a fresh interpreter after a plain `import deepspeed`, where nothing else has
imported the submodules on the way. (test_docs_site_build.py checks that the API reference
documents them.)
"""
import importlib.util
import json
import subprocess
import sys

from docs_paths import ROOT
from spec_list import NAMES_FILE, spec_names

EXTRACTOR = ROOT / "tools" / "spec" / "extract_names.py"


def _extractor():
    spec = importlib.util.spec_from_file_location("extract_names", EXTRACTOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_listed_names_are_those_the_spec_pages_name():
    extractor = _extractor()
    in_pages = set(extractor.spec_names(extractor.SEEDS))
    listed = {name for name, _ in spec_names()}
    assert not in_pages - listed, ("names of the spec pages missing from spec_api_names.txt "
                                   "(run python tools/spec/extract_names.py):\n"
                                   + "\n".join(sorted(in_pages - listed)))
    assert not listed - in_pages, ("names in spec_api_names.txt no spec page names (run "
                                   "python tools/spec/extract_names.py):\n"
                                   + "\n".join(sorted(listed - in_pages)))


def test_the_extractor_rewrites_the_list_unchanged(tmp_path):
    """Running the script keeps the header and every note: what is committed is its output."""
    copy = tmp_path / "names.txt"
    copy.write_text(NAMES_FILE.read_text(encoding="utf-8"), encoding="utf-8")
    extractor = _extractor()
    assert extractor.main([str(extractor.SEEDS), "--output", str(copy)]) == 0
    assert copy.read_text(encoding="utf-8") == NAMES_FILE.read_text(encoding="utf-8")


def test_spec_names_resolve_after_a_plain_import_as_listed():
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import deepspeed, spec_list; "
            "print(json.dumps(spec_list.resolution()))")
    out = subprocess.run([sys.executable, "-c", code, str(NAMES_FILE.parent)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    wrong = []
    for name, reason in spec_names():
        error = report[name]
        if error is None and reason is not None:
            wrong.append(f"{name} resolves now: remove its `unresolved` note and document it")
        elif error is not None and reason is None:
            wrong.append(f"{name} does not resolve after `import deepspeed` ({error}); fix it "
                         f"or, for a garbled name of the source text, mark it `# unresolved:`")
    assert not wrong, "\n".join(wrong)
