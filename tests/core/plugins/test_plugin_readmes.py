"""Every plugin folder's ``README.md`` keeps up with the plugin's code.

The README is what a developer who opens ``plugins/<name>/`` reads first; it drifts silently
when a hook, a config section, a module or a dependency is added without it. For every plugin
registered under the ``deepspeed.plugins`` entry-point group whose package is a folder under
``plugins/``, the README must exist and name (in backticks) every hook the plugin object
implements, as pluggy finds them (the ``deepspeed_impl`` marker ``@deepspeed.hookimpl`` leaves),
every config section key it owns (``deepspeed_config_sections``), every plugin it
``depends_on`` / ``requires`` / ``excludes``, every module and sub-package of its module map,
its compat folders (``runtime_compat/``, ``upstream_paths/``) and its tests folder; a folder
holding a ``torch_patches.py`` keeps a "Process-wide patches" section naming it; and every
relative markdown link resolves to a file in the repository (and an anchor into a markdown
file to one of its headings). Reads files and imports the plugin classes: no engine, no
process group.
"""
import re
from pathlib import Path

import pytest

from deepspeed.plugin_manager import installed_plugins, new_hook_manager

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = ROOT / "plugins"
COMPAT_FOLDERS = ("runtime_compat", "upstream_paths")
PATCHES_MODULE = "torch_patches.py"
LINK = re.compile(r"\]\(([^)\s]+)\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def shipped_plugins():
    """``{entry-point name: (plugin folder, PluginSpec)}`` of the registered plugins whose
    package (``deepspeed.<folder>``) is a folder under ``plugins/``."""
    found = {}
    for name, spec in installed_plugins().items():
        parts = spec.value.split(":")[0].split(".")
        if len(parts) >= 2 and parts[0] == "deepspeed" \
                and (PLUGINS / parts[1] / "__init__.py").is_file():
            found[name] = (PLUGINS / parts[1], spec)
    return found


SHIPPED = shipped_plugins()


def loaded_plugin(spec):
    """The plugin object as the catalog registers it: a fresh instance of a class, else the
    object itself (a module of hook functions)."""
    obj = spec.load()
    return obj() if isinstance(obj, type) else obj


def implemented_hooks(plugin):
    """Names of the hooks ``plugin`` implements: pluggy's own reading of each attribute's
    ``deepspeed_impl`` marker (what ``PluginManager.register`` does), inherited ones included;
    a hookimpl registered under another name (``specname``) counts as that hook."""
    manager = new_hook_manager()
    names = set()
    for attr in dir(plugin):
        opts = manager.parse_hookimpl_opts(plugin, attr)
        if opts is not None:
            names.add(opts.get("specname") or attr)
    return names


def owned_sections(plugin):
    """The config section keys ``plugin`` claims through ``deepspeed_config_sections``."""
    manager = new_hook_manager()
    manager.register(plugin, name="readme-check")
    return {key for answer in manager.hook.deepspeed_config_sections() for key in answer or {}}


def module_map_entries(folder):
    """What the README's module map must name: each module directly in the plugin folder
    (`` `x.py` ``) and each sub-package (`` `d/`` ...), the compat folders included."""
    entries = [f"`{path.name}`" for path in sorted(folder.glob("*.py"))]
    entries += [f"`{path.name}/" for path in sorted(folder.iterdir())
                if path.is_dir() and (path / "__init__.py").is_file()]
    entries += [f"`{name}/" for name in COMPAT_FOLDERS if (folder / name).is_dir()]
    return entries


def slug(heading):
    """The anchor mkdocs / GitHub give a markdown heading (``## `zero_optimization` `` ->
    ``zero_optimization``)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def broken_links(readme, root=ROOT):
    """Each relative link of ``readme`` whose file (or markdown heading) does not exist in the
    repository at ``root``."""
    broken = []
    for target in LINK.findall(readme.read_text(encoding="utf-8")):
        if SCHEME.match(target) or target.startswith("#"):
            continue
        path, _, anchor = target.partition("#")
        resolved = (readme.parent / path).resolve()
        if not resolved.is_relative_to(root) or not resolved.exists():
            broken.append(f"{target} (no such file in the repository)")
        elif anchor and resolved.suffix == ".md":
            headings = re.findall(r"^#+\s+(.+?)\s*$", resolved.read_text(encoding="utf-8"), re.M)
            if anchor not in {slug(h) for h in headings}:
                broken.append(f"{target} (no heading with that anchor)")
    return broken


def test_every_plugin_folder_is_a_registered_plugin_with_a_readme():
    registered = {folder.name for folder, _ in SHIPPED.values()}
    folders = {path.name for path in PLUGINS.iterdir() if (path / "__init__.py").is_file()}
    assert folders <= registered, (f"plugin folders no entry point registers (pyproject.toml, "
                                   f"deepspeed.plugins): {sorted(folders - registered)}")
    missing = sorted(name for name in folders if not (PLUGINS / name / "README.md").is_file())
    assert not missing, f"plugin folders without README.md: {missing}"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_plugin_readme_names_what_the_plugin_has(name):
    folder, spec = SHIPPED[name]
    readme = folder / "README.md"
    assert readme.is_file(), f"{readme.relative_to(ROOT)} is missing"
    text = readme.read_text(encoding="utf-8")
    plugin = loaded_plugin(spec)
    expected = {
        "hooks it implements": [f"`{hook}`" for hook in sorted(implemented_hooks(plugin))],
        "config sections it owns": [f"`{key}`" for key in sorted(owned_sections(plugin))],
        "plugins it depends on, requires or excludes": [
            f"`{other}`" for attr in ("depends_on", "requires", "excludes")
            for other in getattr(plugin, attr, ())],
        "entries of its module map": module_map_entries(folder),
        "its tests": [f"pytest tests/plugins/{folder.name}"],
    }
    if any(folder.rglob(PATCHES_MODULE)):
        expected["process-wide patches"] = ["## Process-wide patches"] + [
            str(path.relative_to(ROOT)) for path in sorted(folder.rglob(PATCHES_MODULE))]
    missing = {what: [item for item in items if item not in text]
               for what, items in expected.items()}
    missing = {what: items for what, items in missing.items() if items}
    assert not missing, (f"{readme.relative_to(ROOT)} does not name these (add them, in "
                         f"backticks, to the matching section): {missing}")
    assert (ROOT / "tests" / "plugins" / folder.name).is_dir(), \
        f"the README points to tests/plugins/{folder.name}, which does not exist"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_plugin_readme_links_resolve(name):
    folder, _ = SHIPPED[name]
    readme = folder / "README.md"
    assert readme.is_file(), f"{readme.relative_to(ROOT)} is missing"
    broken = broken_links(readme)
    assert not broken, f"{readme.relative_to(ROOT)}: links that do not resolve: {broken}"


def test_readme_link_check_catches_a_missing_file_and_a_missing_heading(tmp_path):
    """The link check itself: a link to a file that does not exist, or to a heading a markdown
    file lacks, or out of the repository, is reported; good ones are not."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## `some_key`\n", encoding="utf-8")
    readme = tmp_path / "plugins" / "x" / "README.md"
    readme.parent.mkdir(parents=True)
    readme.write_text("[ok](../../docs/page.md#some_key) [web](https://example.org/a) [top](#x)\n"
                      "[gone](../../docs/missing.md) [bad anchor](../../docs/page.md#other)\n"
                      "[outside](../../../elsewhere.md)\n", encoding="utf-8")
    found = broken_links(readme, root=tmp_path)
    assert [entry.split(" ")[0] for entry in found] == [
        "../../docs/missing.md", "../../docs/page.md#other", "../../../elsewhere.md"]
