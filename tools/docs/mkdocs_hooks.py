"""MkDocs hooks of the documentation site (named in mkdocs.yml under `hooks:`).

- `on_config`: lay the `deepspeed` package out as one folder tree for the API reference
  (package_tree.py), because mkdocstrings reads sources statically and the repository spreads
  the package over core/, plugins/, accelerators/ and op_builder/.
- `on_files`: serve the configuration reference freshly generated from the config models
  (gen_config_reference.py) in place of the committed docs/reference/config.md, so the site can
  never show a stale page; tests/docs/test_config_reference.py keeps the committed copy equal.
"""
import sys
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import gen_config_reference  # noqa: E402  (this folder)
import package_tree  # noqa: E402

CONFIG_PAGE = "reference/config.md"
API_SOURCE_TREE = "build/docs/api_src"  # relative to mkdocs.yml; mkdocs.yml's handler `paths`


@event_priority(100)  # before mkdocstrings' on_config: griffe drops search paths that do not exist yet
def on_config(config):
    root = Path(config.config_file_path).resolve().parent
    package_tree.build_tree(root / API_SOURCE_TREE, root)
    return config


def on_files(files, config):
    existing = files.get_file_from_path(CONFIG_PAGE)
    if existing is not None:
        files.remove(existing)
    files.append(File.generated(config, CONFIG_PAGE, content=gen_config_reference.render()))
    return files
