"""The installed package is built in floors, and no floor imports one above it:

    accelerator < utils < config < comm < the rest of the core < plugins

A floor is the package a module is installed in (``deepspeed.accelerator``, ``deepspeed.utils``,
``deepspeed.config``, ``deepspeed.comm``), except that a module's *source folder* decides for the
upstream-path shims setup.py installs inside a lower package: ``deepspeed.utils.groups`` comes
from ``core/upstream_paths`` (the rest of the core), ``deepspeed.utils.zero_to_fp32`` from a
plugin's ``upstream_paths`` (plugins). The imports are those test_import_graph.py reads
(deferred ones and literal ``importlib.import_module`` included).

An import of a module on a higher floor is an upward arrow unless that module is part of the
core and its own imports, followed all the way, reach nothing above the importer's floor but
*leaves* (modules importing nothing of deepspeed; a plugin module is always above): depending on
``deepspeed.hooks`` (a leaf) or on the plugin catalog (which only needs the leaves
``deepspeed.hooks`` and ``deepspeed.utils.entry_points``) adds nothing above. Loading the
installed plugins' entry points is the seam through which a lower floor reaches features
without importing them; it is not an import and is not counted.
"""
from test_import_graph import import_graph, installed_packages, module_files, package_map

FLOORS = ("accelerator", "utils", "config", "comm", "core", "plugins")
LOWER_PACKAGES = {"deepspeed.accelerator": "accelerator", "deepspeed.utils": "utils",
                  "deepspeed.config": "config", "deepspeed.comm": "comm"}


def _package_of(module, packages):
    """The longest package name that ``module`` is (or lies directly in)."""
    while module and module not in packages:
        module = module.rpartition(".")[0]
    return module


def floor_of(module, folders):
    """The floor of ``module`` from the folder its package comes from and its name."""
    package = _package_of(module, folders)
    folder = folders[package].replace("\\", "/")
    if folder.startswith("plugins/"):
        return "plugins"
    if "/upstream_paths/" in f"/{folder}/":
        return "core"
    for prefix, floor in LOWER_PACKAGES.items():
        if module == prefix or module.startswith(prefix + "."):
            return floor
    return "core"


def reach(graph, floors):
    """{module: the highest floor among everything it imports, transitively, not counting
    leaves (modules that import nothing of deepspeed); -1 when that is nothing}."""
    memo = {}

    def visit(module, seen):
        if module in memo:
            return memo[module]
        highest = -1
        for target in graph.get(module, ()):
            if target in seen:
                continue
            own = FLOORS.index(floors[target]) if graph.get(target) else -1
            highest = max(highest, own, visit(target, seen | {target}))
        memo[module] = highest
        return highest

    return {module: visit(module, {module}) for module in graph}


def upward_arrows(graph, floors):
    """``["a (floor) -> b (floor)"]`` for each import from a floor to a higher one: a plugin's,
    or a core module that reaches above the importer."""
    reached = reach(graph, floors)
    found = []
    for module in sorted(graph):
        own = FLOORS.index(floors[module])
        for target in sorted(graph[module]):
            above = FLOORS.index(floors[target]) > own
            if above and (floors[target] == "plugins" or reached[target] > own):
                found.append(f"{module} ({floors[module]}) -> {target} ({floors[target]})")
    return found


def test_no_floor_imports_one_above_it():
    folders = package_map()
    modules = module_files(installed_packages())
    floors = {module: floor_of(module, folders) for module in modules}
    assert floors["deepspeed.utils.groups"] == "core"  # the topology's view, installed in utils
    assert floors["deepspeed.utils.zero_to_fp32"] == "plugins"
    assert floors["deepspeed.comm.observers"] == "comm" and floors["deepspeed.zero"] == "plugins"
    found = upward_arrows(import_graph(modules), floors)
    assert not found, "imports up the floors:\n" + "\n".join(found)


def test_the_checker_catches_planted_arrows():
    folders = {"deepspeed.utils": "core/utils", "deepspeed.config": "core/config",
               "deepspeed.comm": "core/comm", "deepspeed": "core", "deepspeed.zero": "plugins/zero",
               "deepspeed.utils.groups": "core/upstream_paths/utils/groups"}
    graph = {
        "deepspeed.utils.a": {"deepspeed.comm.b"},  # upward, and comm reaches the core
        "deepspeed.comm.b": {"deepspeed.engine"},
        "deepspeed.engine": {"deepspeed.zero.stage3"},
        "deepspeed.zero.stage3": {"deepspeed.hooks"},
        "deepspeed.config.c": {"deepspeed.hooks", "deepspeed.catalog"},  # needs only leaves
        "deepspeed.hooks": set(),
        "deepspeed.catalog": {"deepspeed.hooks", "deepspeed.utils.leaf"},
        "deepspeed.utils.leaf": set(),
        "deepspeed.utils.d": {"deepspeed.utils.groups"},  # the shim is core: upward
        "deepspeed.utils.groups": {"deepspeed.comm.b"},
    }
    floors = {module: floor_of(module, folders) for module in graph}
    assert floors["deepspeed.utils.groups"] == "core"
    assert floors["deepspeed.zero.stage3"] == "plugins"
    assert upward_arrows(graph, floors) == [
        "deepspeed.comm.b (comm) -> deepspeed.engine (core)",
        "deepspeed.engine (core) -> deepspeed.zero.stage3 (plugins)",
        "deepspeed.utils.a (utils) -> deepspeed.comm.b (comm)",
        "deepspeed.utils.d (utils) -> deepspeed.utils.groups (core)",
    ]
