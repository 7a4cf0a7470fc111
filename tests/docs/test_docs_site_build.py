"""The documentation site: `mkdocs build --strict` succeeds (every page is in the nav, every
link and anchor resolves, every `:::` API entry is found), and the API reference documents every
name of the spec that resolves (tests/docs/spec_api_names.txt; test_spec_names.py checks that
they resolve).

The site is built once per session into a temporary directory. Building needs the `docs` extra
(also in `dev`); without mkdocs the build tests skip and say so.
"""
import os
import subprocess
import sys
import zlib

import pytest

from docs_paths import ROOT
from spec_list import spec_names

# the build (mkdocstrings renders a few hundred objects) takes a minute of CPU, several on a
# loaded two-core machine; it is charged to the first test that uses the fixture
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings_handlers.python",
                        reason="mkdocstrings-python is not installed: pip install -e '.[docs]'")
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                             str(site)], cwd=ROOT, env=env, capture_output=True, text=True)
    return result, site


def test_mkdocs_build_strict_passes(built_site):
    result, site = built_site
    problems = [line for line in result.stderr.splitlines()
                if line.startswith(("WARNING", "ERROR"))]
    assert result.returncode == 0, ("mkdocs build --strict failed:\n" + "\n".join(problems)
                                    + "\n" + result.stderr[-3000:])
    assert (site / "index.html").is_file()



# ---------------------------------------------------------------------------- API coverage
def inventory_names(site):
    """Every object the API reference rendered (mkdocstrings' objects.inv)."""
    data = (site / "objects.inv").read_bytes()
    header_end = 0
    for _ in range(4):  # four header lines, then zlib
        header_end = data.index(b"\n", header_end) + 1
    text = zlib.decompress(data[header_end:]).decode("utf-8")
    return {line.split(" ", 1)[0] for line in text.splitlines() if line.strip()}


def test_api_reference_documents_every_resolvable_spec_name(built_site):
    result, site = built_site
    assert result.returncode == 0, result.stderr[-3000:]
    rendered = inventory_names(site)
    missing = [name for name, reason in spec_names() if reason is None and name not in rendered]
    assert not missing, ("names of the spec missing from the API reference (add a `:::` entry "
                         "to a page under docs/reference/api/):\n" + "\n".join(missing))
