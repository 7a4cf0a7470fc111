"""The key-effect table (the "effect" column of docs/reference/config.md): every config key says
what it does here, and every key the DeepSpeed docs document has a row.

A key's effect is declared next to its field, in the section model's ``tested_by`` (implemented:
the test that fails without it), ``without_effect`` (accepted, warned once, with the reason) or
``refused`` (an error with the reason); a plain-value plugin section uses its plugin's
``tested_by``. The documented keys are tests/docs/spec_config_keys.txt, extracted from the spec
by tools/spec/extract_config_keys.py.
"""
import ast
import functools
import re
import textwrap

import pytest
from docs_paths import ROOT

import gen_config_reference as ref

DOCUMENTED = ROOT / "tests" / "docs" / "spec_config_keys.txt"
TEST_ID = re.compile(r"^(tests/[\w/]+\.py)::(?:(\w+)::)?(test\w*)$")


@functools.lru_cache(maxsize=None)
def effects():
    return ref.key_effects()


def documented_keys():
    lines = DOCUMENTED.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_every_key_says_what_it_does_here():
    missing = [full for full, row in effects() if row.effect is None]
    assert missing == [], (
        f"{len(missing)} config keys are accepted without a declared effect: give each an "
        f"entry in its section model's tested_by (the test that fails without it), "
        f"without_effect (warned, why) or refused (why, what instead): {missing}")


def test_no_key_is_merely_ignored():
    said = [(full, row.effect.detail) for full, row in effects()
            if row.effect is not None and re.search(r"\bignored?\b", row.effect.detail, re.I)]
    assert said == [], f"say why a key has no effect and what to use instead: {said}"


@functools.lru_cache(maxsize=None)
def _test_sources(path):
    """{test name or Class::test: its source with decorators, and the module-level constants
    and helper functions it names (a test often builds its config in a helper it runs on the
    ranks)} of one test file."""
    text = (ROOT / path).read_text(encoding="utf-8")
    tree = ast.parse(text)
    constants = {}
    for node in tree.body:  # helpers imported from a module next to the test file
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            helper = (ROOT / path).parent / f"{node.module}.py"
            if helper.is_file():
                defined = _definitions(helper)
                constants.update((a.asname or a.name, defined[a.name]) for a in node.names
                                 if a.name in defined)
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = ast.get_source_segment(text, node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and not node.name.startswith("test"):
            constants[node.name] = ast.get_source_segment(text, node)
    found = {}

    def add(node, prefix=""):
        start = min([d.lineno for d in node.decorator_list] + [node.lineno])
        source = "\n".join(text.splitlines()[start - 1:node.end_lineno])
        used = _names_in(source)
        for _ in range(2):  # what the helpers it names use in turn (a worker's config constant)
            used |= {name for known in sorted(used & set(constants))
                     for name in _names_in(constants[known])}
        source += "\n".join(constants[name] for name in sorted(used & set(constants)))
        found[prefix + node.name] = source

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            add(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    add(item, node.name + "::")
    return found


def _names_in(source):
    """The names a piece of source reads (a method cut out of its class is dedented first)."""
    return {n.id for n in ast.walk(ast.parse(textwrap.dedent(source)))
            if isinstance(n, ast.Name)}


@functools.lru_cache(maxsize=None)
def _definitions(path):
    """{name: source} of the module-level functions and assignments of a helper module."""
    text = path.read_text(encoding="utf-8")
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found[node.name] = ast.get_source_segment(text, node)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = ast.get_source_segment(text, node)
    return found


def _spellings(full, row):
    parts = full.split(".")
    leaf = parts[-1] if parts[-1] != "<name>" else parts[-2]
    return {leaf, *row.aliases}


def test_each_implemented_key_names_a_test_that_exists_and_sets_the_key():
    problems = []
    for full, row in effects():
        if row.effect is None or row.effect.kind != ref.IMPLEMENTED:
            continue
        match = TEST_ID.match(row.effect.detail)
        if match is None:
            problems.append(f"{full}: '{row.effect.detail}' is not tests/<file>.py::<test>")
            continue
        path, cls, name = match.groups()
        if not (ROOT / path).is_file():
            problems.append(f"{full}: {path} does not exist")
            continue
        source = _test_sources(path).get(f"{cls}::{name}" if cls else name)
        if source is None:
            problems.append(f"{full}: {path} has no test {cls + '::' if cls else ''}{name}")
            continue
        names = _spellings(full, row)
        if not any(re.search(rf"\b{re.escape(n)}\b", source) for n in names):
            problems.append(f"{full}: {row.effect.detail} never names the key "
                            f"({' / '.join(sorted(names))})")
    assert problems == [], "\n".join(problems)


def _row_spellings():
    """Every way to write each row's full path (aliases and deprecated names of the key and of
    the sections above it), and the rows that hold free-form values."""
    spelled = {key: {key} for key, _, _ in ref.all_sections() if key}  # the sections
    free_form = set()
    for full, row in effects():
        parent, _, leaf = full.rpartition(".")
        heads = spelled.get(parent, {parent}) if parent else {""}
        names = {leaf, *row.aliases}
        spelled[full] = {f"{head}.{name}" if head else name for head in heads for name in names}
        if row.effect is not None and row.effect.kind != ref.SECTION:
            free_form.add(full)
    return spelled, free_form


def test_every_documented_key_has_a_row():
    spelled, free_form = _row_spellings()
    patterns = {}
    for full, spellings in spelled.items():
        for spelling in spellings:
            patterns[spelling] = full
    wildcards = [(re.compile(re.escape(s).replace("<name>", r"[\w-]+")), full)
                 for s, full in patterns.items() if "<name>" in s]
    missing = []
    for key in documented_keys():
        parts = key.split(".")
        prefixes = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
        hit = None
        for depth, prefix in enumerate(prefixes):
            full = patterns.get(prefix) or next(
                (f for pattern, f in wildcards if pattern.fullmatch(prefix)), None)
            if full is not None and (depth == 0 or full in free_form):
                hit = full  # the key itself, or inside a free-form value (optimizer.params)
                break
        if hit is None:
            missing.append(key)
    assert missing == [], (
        f"documented keys with no row in the key-effect table (add the key to its section "
        f"model, with its effect): {missing}")


def test_the_committed_list_holds_every_key_of_the_spec_pages_in_the_repository():
    """The repository's copy of the spec pages (docs/dev/spec, the seed pages only) yields no
    key the committed list lacks: a key added to the pages is caught here. The list itself
    comes from the full spec, checklists included (tools/spec/extract_config_keys.py)."""
    pages = ROOT / "docs" / "dev" / "spec"
    if not pages.is_dir():
        pytest.skip("no copy of the spec pages in this checkout (docs/dev/spec)")
    import sys

    sys.path.insert(0, str(ROOT / "tools" / "spec"))
    try:
        from extract_config_keys import documented_keys as extract
    finally:
        sys.path.remove(str(ROOT / "tools" / "spec"))
    missing = sorted(set(extract(pages)) - set(documented_keys()))
    assert missing == [], f"rerun tools/spec/extract_config_keys.py over the spec: {missing}"


def _flipped(row):
    """A value other than the default for a refused key, where one is obvious."""
    if row.type == "bool":
        return row.default != "true"
    if row.type in ("int", "float"):
        return float(row.default) + 1 if row.type == "float" else int(row.default) + 1
    return None


@pytest.mark.parametrize("full", [full for full, row in ref.key_effects()
                                  if row.effect is not None and row.effect.kind == ref.REFUSED])
def test_a_refused_key_is_an_error_naming_it(full):
    from deepspeed.config import DeepSpeedConfig, DeepSpeedConfigError

    row = dict(effects())[full]
    value = _flipped(row)
    if value is None:
        pytest.skip(f"no obvious non-default value for {full} ({row.type})")
    parts = full.split(".")
    if parts[0] == ref.INFERENCE_KEY:
        from deepspeed.inference.config import DeepSpeedInferenceConfig

        config = value
        for part in reversed(parts[1:]):
            config = {part: config}
        with pytest.raises(ValueError, match=re.escape(parts[-1])):
            DeepSpeedInferenceConfig(**config)
        return
    config = value
    for part in reversed(parts):
        config = {part: config}
    with pytest.raises(DeepSpeedConfigError, match=re.escape(parts[-1])):
        DeepSpeedConfig({"train_batch_size": 1, **config}, world_size=1)
