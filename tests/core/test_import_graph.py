"""The installed `deepspeed` package has no import circles.

A circle (`a` imports `b` imports ... imports `a`) means neither module can be understood, tested
or loaded without the other, and which half finishes loading first depends on who imported first.
This test parses every module of the installed package and fails listing each circle.

What is scanned: every package of setup.py's `package_map()` (the folders that become the
`deepspeed` namespace, plugins and their `deepspeed.runtime.<plugin>` compatibility paths
included), located by asking the import system's finders (`sys.meta_path`) as `import` would,
so the files checked are the installed ones whether the install is editable or a wheel, and no
module is executed (a package that fails to import still gets its imports checked).
`package_map` is read by running setup.py with `setuptools.setup` replaced by a no-op: the list
is computed in exactly one place.

Which imports count, as edges from the importing module:

* every `import` / `from ... import` statement, wherever it is: at module level, and also inside
  functions and methods. A deferred import still makes the two modules depend on each other; it
  only hides the circle from the interpreter, so it is exactly what this test must see. The
  internal modules are never optional, so there is no optional-dependency exception;
* `importlib.import_module("<literal name>")` and `lazy_module("<literal name>")` calls
  (`deepspeed.utils.lazy_module`: a module imported on first attribute access), for the same
  reason;
* not imports under `if TYPE_CHECKING:` (they never run);
* not names outside `deepspeed`.

What an import names: `import a.b.c` and `from a.b import c` (when `a.b.c` is a module) name the
module `a.b.c` only. Python also runs the parent packages' `__init__` on the way, but a package
`__init__` that re-exports its submodules would otherwise form a circle with every submodule
that imports a sibling by its full path, which is the sanctioned way to import it. An edge to a
package therefore exists only when the import names the package itself (`import a.b`,
`from a.b import name_defined_in_its_init`). Relative imports are resolved against the importing
module's package. A name that is not a known module falls back to the longest known module
prefix (a name defined in that package's `__init__`).
"""
import ast
import os
import runpy
import sys
from pathlib import Path
from unittest import mock

import setuptools

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "deepspeed"

# Circles that are inherent, each with its reason: {frozenset of module names: reason}.
ALLOWED_CIRCLES = {}


def _find_spec(name, found):
    """The spec the import system would use for `name`, asking the `sys.meta_path` finders as
    `import` does, but without executing any module (a parent's location comes from its spec)."""
    if name not in found:
        parent = name.rpartition(".")[0]
        path = None
        if parent:
            parent_spec = _find_spec(parent, found)
            path = list(parent_spec.submodule_search_locations or []) if parent_spec else None
        found[name] = None
        for finder in sys.meta_path:
            spec = finder.find_spec(name, path) if hasattr(finder, "find_spec") else None
            if spec is not None:
                found[name] = spec
                break
    return found[name]


def package_map():
    """{package import name: source folder relative to the repository} from setup.py."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DS_BUILD_")}
    with mock.patch.object(setuptools, "setup", lambda **kwargs: None), \
            mock.patch.dict(os.environ, env, clear=True), \
            mock.patch.dict(sys.modules):  # forget the helpers setup.py imports (op_builder/aot)
        namespace = runpy.run_path(str(ROOT / "setup.py"), run_name="setup_for_import_graph")
    return namespace["package_map"]()


def installed_packages():
    """{package import name: folder} of every Python package setup.py installs, as installed."""
    folders, specs = {}, {}
    for name in package_map():
        spec = _find_spec(name, specs)
        assert spec is not None and spec.submodule_search_locations, f"{name} is not installed"
        folders[name] = Path(list(spec.submodule_search_locations)[0])
    return folders


def module_files(packages):
    """{module import name: file} for every .py module of the given packages."""
    modules = {}
    for package, folder in packages.items():
        for path in sorted(folder.glob("*.py")):
            name = package if path.name == "__init__.py" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


def _is_type_checking(test):
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


#: calls whose literal first argument names a module they import (now or on first use)
DEFERRED_IMPORTS = ("import_module", "lazy_module")


def _import_nodes(tree):
    """Every import statement and literal `importlib.import_module` / `lazy_module` call, skipping the bodies of
    `if TYPE_CHECKING:` (their `else:` branch still runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr in DEFERRED_IMPORTS)
                   or (isinstance(node.func, ast.Name) and node.func.id in DEFERRED_IMPORTS))):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _known(name, modules):
    """`name` if it is a module, else its longest prefix that is one (None outside the package)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imported_modules(module, path, modules):
    """The package modules `module` (at `path`) imports, per the rules in this file's docstring."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.Call):
            targets = [node.args[0].value]
        else:
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            targets = []
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.append(submodule if submodule in modules else base)
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                known = _known(target, modules)
                if known is not None and known != module:
                    found.add(known)
    return found


def import_graph(modules):
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph):
    """Tarjan's algorithm, iterative: the components with more than one module (or a self-loop)."""
    index, low, on_stack, stack, result = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    result.append(component)
    return result


def _chain(component, graph):
    """One closed walk `a -> b -> ... -> a` through the component, for the failure message: the
    shortest cycle through its alphabetically first module."""
    start = min(component)
    previous, frontier = {start: None}, [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    walk = [node]
                    while previous[walk[-1]] is not None:
                        walk.append(previous[walk[-1]])
                    return " -> ".join(list(reversed(walk)) + [start])
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return start


def circles(graph):
    """[(component, chain)] of every circle not in ALLOWED_CIRCLES."""
    found = []
    for component in strongly_connected(graph):
        if frozenset(component) not in ALLOWED_CIRCLES:
            found.append((component, _chain(component, graph)))
    return sorted(found, key=lambda item: item[1])


def test_the_installed_package_has_no_import_circle():
    modules = module_files(installed_packages())
    assert "deepspeed.accelerator.registry" in modules and "deepspeed.zero" in modules
    graph = import_graph(modules)
    found = circles(graph)
    message = "\n".join(f"circle of {len(component)} modules: {chain}"
                        + (f"\n    all of them: {', '.join(sorted(component))}"
                           if len(component) > chain.count(" -> ") else "")
                        for component, chain in found)
    assert not found, "import circles in the installed package:\n" + message


def test_allowed_circles_give_a_reason():
    for component, reason in ALLOWED_CIRCLES.items():
        assert len(component) > 1 and isinstance(reason, str) and reason.strip()


def _write(folder, files):
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_sees_deferred_relative_and_literal_imports_but_not_type_checking(tmp_path):
    _write(tmp_path, {
        "deepspeed/__init__.py": "",
        "deepspeed/a/__init__.py": "from deepspeed.a.low import thing\n",
        "deepspeed/a/low.py": "def f():\n    from ..b import high\nthing = 1\n",
        "deepspeed/b/__init__.py": "",
        "deepspeed/b/high.py": "from deepspeed.a import low\n",
        "deepspeed/c.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                           "    from deepspeed.d import x\nimport importlib\n"),
        "deepspeed/d.py": "import importlib\nimportlib.import_module('deepspeed.c')\n",
        "deepspeed/f.py": "from deepspeed.utils.lazy_module import lazy_module\nb = lazy_module('deepspeed.e')\n",
        "deepspeed/e.py": "from deepspeed.a import thing\n",
    })
    packages = {"deepspeed": tmp_path / "deepspeed", "deepspeed.a": tmp_path / "deepspeed/a",
                "deepspeed.b": tmp_path / "deepspeed/b"}
    graph = import_graph(module_files(packages))
    assert graph["deepspeed.a.low"] == {"deepspeed.b.high"}  # deferred + relative
    assert graph["deepspeed.b.high"] == {"deepspeed.a.low"}  # submodule, not the package
    assert graph["deepspeed.c"] == set()  # TYPE_CHECKING only
    assert graph["deepspeed.d"] == {"deepspeed.c"}  # literal import_module
    assert "deepspeed.e" in graph["deepspeed.f"]  # literal lazy_module
    assert graph["deepspeed.e"] == {"deepspeed.a"}  # a name from the package's __init__
    found = circles(graph)
    assert [chain for _, chain in found] == [
        "deepspeed.a.low -> deepspeed.b.high -> deepspeed.a.low"]
