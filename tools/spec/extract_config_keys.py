"""List every config key the DeepSpeed documentation (the spec) documents, one dotted path a line.

    python tools/spec/extract_config_keys.py SPEC_DIR > tests/core/config/documented_config_keys.txt

SPEC_DIR holds `seeds/` (plain-text copies of the documentation pages) and `checklists/` (the
per-area summaries made from them). Three sources, because the docs state keys three ways:

1. The config classes of the API reference (`class deepspeed.runtime.zero.config.
   DeepSpeedZeroConfig` followed by `stage: ZeroStageEnum = 0`, ...): every field, under the
   config key the reference says the class parses (`CLASS_KEYS` below). A default written as
   another class's constructor (`activation: ActivationQuantConfig = ActivationQuantConfig(
   q_type='symmetric', ...)`) documents that section's keys too. The `init_inference` config is
   not part of the JSON training config; its keys are listed under the prefix `init_inference.`.
2. JSON config examples in the pages (whole configs and fragments such as
   `"zero_optimization": {...}`): every key path, read with a tolerant scanner because the
   examples leave out values (`"..."`), use `5e8` and trailing commas. A brace block written
   with Python literals (`True`, `None`) is Python, not a JSON config, and is skipped. The
   contents of `optimizer.params` / `scheduler.params` are the optimizer's and scheduler's
   constructor arguments, not config keys of their own: the path stops at `params`.
3. The checklists: every key of a table of full key paths (its header starts `| key (dotted) |`)
   and every backticked dotted path whose first part is a top-level key found by (1) or (2)
   (`checkpoint.tag_validation`), file names (`checkpoint.json`) aside.

The output is committed as tests/core/config/documented_config_keys.txt; the key-effect test
(tests/core/config/test_key_effects.py) checks that each key has a row in the generated table.
Rerun this script when the spec changes and commit the difference.
"""
import re
import sys
from pathlib import Path
from typing import Iterable, List, Optional, Set, Tuple

# the config key each documented config class validates (stated in the API reference's prose)
CLASS_KEYS = {
    "deepspeed.runtime.zero.config.DeepSpeedZeroConfig": "zero_optimization",
    "deepspeed.runtime.zero.config.DeepSpeedZeroOffloadParamConfig":
        "zero_optimization.offload_param",
    "deepspeed.runtime.zero.config.DeepSpeedZeroOffloadOptimizerConfig":
        "zero_optimization.offload_optimizer",
    "deepspeed.monitor.config.TensorBoardConfig": "tensorboard",
    "deepspeed.monitor.config.WandbConfig": "wandb",
    "deepspeed.monitor.config.CSVConfig": "csv_monitor",
    "deepspeed.inference.config.DeepSpeedInferenceConfig": "init_inference",  # INFERENCE
    "deepspeed.inference.config.DeepSpeedTPConfig": "init_inference.tensor_parallel",
    "deepspeed.inference.config.DeepSpeedMoEConfig": "init_inference.moe",
    "deepspeed.inference.config.QuantizationConfig": "init_inference.quant",
    "deepspeed.inference.config.InferenceCheckpointConfig": "init_inference.checkpoint_config",
}
# brace blocks and dotted names in the pages that are not DeepSpeed config keys
NOT_CONFIG = {
    "datasets": "the BERT tutorial's own JSON (its data files), shown next to its DeepSpeed config",
    "optimizer.cur_scale": "an attribute of the fp16 optimizer object, not a key",
}
# sections the pages show on their own, away from the section they belong in
NESTED_IN = {
    "weight_quantization": "compression_training",  # the compression tutorial's prose
    "model_info": "autotuning",  # the autotuning checklist lists it after the section's keys
}
INFERENCE = "init_inference"
# free-form values: their contents are arguments of something else, not config keys
OPAQUE = {"optimizer.params", "scheduler.params"}

_CLASS_LINE = re.compile(r"^\s*class\s+([\w.]+)")
_FIELD = re.compile(r"^\s*`?([a-z_][a-z0-9_]*):\s*`?[^=\n]+?=\s*(.*)$")
_BLOCK_END = re.compile(r"^\s*(Example\b|CHAPTER\b|\d+(\.\d+)+\s|deepspeed\.\w+\()")
_CONSTRUCTED = re.compile(r"^[A-Z]\w*Config\(")
_KWARG = re.compile(r"\b([a-z_][a-z0-9_]*)=")


def class_keys(text: str) -> Set[str]:
    """Keys of the documented config classes (source 1)."""
    found, prefix, pending = set(), None, None
    for line in text.splitlines() + [""]:
        if pending is not None:  # a constructor default spread over lines
            pending[1] += " " + line
            if pending[1].count("(") > pending[1].count(")"):
                continue
            found.update(f"{pending[0]}.{kw}" for kw in _KWARG.findall(pending[1]))
            pending = None
        match = _CLASS_LINE.match(line)
        if match:
            prefix = CLASS_KEYS.get(match.group(1))
            continue
        if prefix is None:
            continue
        if _BLOCK_END.match(line):
            prefix = None
            continue
        field = _FIELD.match(line)
        if field is None:
            continue
        name, default = field.groups()
        found.add(f"{prefix}.{name}")
        if _CONSTRUCTED.match(default):
            pending = [f"{prefix}.{name}", default]
    return found


_TOKEN = re.compile(r'"((?:[^"\\\n]|\\.)*)"\s*(:)?\s*([{\[])?|([{}\[\]])'
                    r'|\b(True|False|None)\b|(^```|^#+ |\n\s*\n\s*\n)', re.MULTILINE)
_KEY = re.compile(r"[a-z_][a-z0-9_-]*")
_SKIP = None  # the stack entry of a subtree that is not config (under a key that is no name)


def json_blocks(text: str) -> Tuple[List[Set[str]], Set[str]]:
    """Key paths of the JSON config examples and fragments (source 2).

    Returns (the key paths of each brace block, the key paths of fragments outside braces such
    as `"zero_optimization": {...}`). Either may be a nested section shown on its own
    (`{"type": "Adam", "params": {...}}`, `"schedule_config": {`), so `documented_keys` keeps
    only those that connect to a top-level key. Outside braces only a section fragment counts:
    a lone `"bits": 8` in prose has no place. A code fence, a heading or a long blank stretch
    ends an unbalanced snippet."""
    found: List[Set[str]] = []
    fragments: Set[str] = set()
    stack: List[Optional[str]] = []  # per open brace: the key it is the value of ("" if none)
    block: Set[str] = set()
    state = {"python": False, "fragment": False}

    def close_block():
        if state["python"]:
            pass
        elif state["fragment"]:
            fragments.update(block)
        elif block:
            found.append(set(block))
        block.clear()
        state.update(python=False, fragment=False)

    for match in _TOKEN.finditer(text):
        key, colon, opened, brace, literal, reset = match.groups()
        if reset is not None:
            if stack:
                stack.clear()
                block.clear()
                state.update(python=False, fragment=False)
            continue
        if literal is not None:
            state["python"] = state["python"] or bool(stack)
            continue
        if brace in ("{", "["):
            stack.append(_SKIP if stack and stack[-1] is _SKIP else "")
            continue
        if brace in ("}", "]"):
            if stack:
                stack.pop()
                if not stack:
                    close_block()
            continue
        if colon is None:  # a string value, or a quoted word in prose
            if opened:
                stack.append(_SKIP if stack and stack[-1] is _SKIP else "")
            continue
        path = ".".join([part for part in stack if part] + [key])
        skipped = (_SKIP in stack or _KEY.fullmatch(key) is None
                   or any(path.startswith(opaque + ".") for opaque in OPAQUE))
        if not stack and not opened:
            continue  # a lone "key": value outside braces
        if not stack:
            state["fragment"] = True
        if not skipped:
            block.add(path)
        if opened:
            stack.append(_SKIP if skipped else key)
    return found, fragments


FILE_SUFFIXES = {"json", "pt", "bin", "py", "txt", "sh", "md"}
_BACKTICKED = re.compile(r"`([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)`")


def checklist_keys(text: str, roots: Iterable[str]) -> Set[str]:
    """Backticked dotted key paths under a known top-level key (source 3)."""
    roots = set(roots)
    found = set()
    in_key_table = False
    for line in text.splitlines():  # a table of full key paths ("| key (dotted) | ...")
        if line.startswith("| key (dotted) |"):
            in_key_table = True
        elif not line.startswith("|"):
            in_key_table = False
        elif in_key_table:
            first = re.match(r"\|\s*`([a-z_][a-z0-9_.]*)`\s*\|", line)
            if first:
                found.add(first.group(1))
    for path in _BACKTICKED.findall(text):
        if path.rsplit(".", 1)[1] in FILE_SUFFIXES:
            continue
        if path.split(".")[0] in roots and not any(path.startswith(o + ".") for o in OPAQUE):
            found.add(path)
    return found


def documented_keys(spec: Path) -> List[str]:
    """The keys of the pages under `spec`: its `seeds/*.txt` and `checklists/*.md`, or, for a
    folder holding the seed pages themselves (the repository's copy), its `*.txt`."""
    seeds = spec / "seeds" if (spec / "seeds").is_dir() else spec
    pages = [page.read_text(encoding="utf-8") for page in
             sorted(seeds.glob("*.txt")) + sorted((spec / "checklists").glob("*.md"))]
    found: Set[str] = set()
    blocks: List[Set[str]] = []
    for text in pages:
        whole, fragments = json_blocks(text)
        found |= class_keys(text)
        blocks += whole + [{key for key in fragments if key.split(".")[0] == root}
                           for root in {key.split(".")[0] for key in fragments}]
    # a block is a config when it shares a top-level key with the config classes or with
    # another block already known to be a config (a whole config links its sections)
    roots = {key.split(".")[0] for key in found}
    grown = True
    while grown:
        grown = False
        for block in blocks:
            tops = {key.split(".")[0] for key in block}
            if tops & roots and not block <= found:
                found |= block
                roots |= tops
                grown = True
    # a block of its own top-level section (`{"flops_profiler": {...}}`) counts too, unless its
    # section is one the configs above nest elsewhere (`offload_optimizer`, `params`)
    nested = {part for key in found if not key.startswith(INFERENCE + ".")
              for part in key.split(".")[1:]}
    for block in blocks:
        sections = {key.split(".")[0] for key in block if "." in key}
        if sections and not sections & nested:
            found |= {NESTED_IN[key.split(".")[0]] + "." + key if key.split(".")[0] in NESTED_IN
                      else key for key in block}
    roots = {key.split(".")[0] for key in found}
    for text in pages:
        found |= checklist_keys(text, roots)
    return sorted(key for key in found if key.split(".")[0] not in NOT_CONFIG
                  and key not in NOT_CONFIG)


def main(argv: List[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__, file=sys.stderr)
        return 2
    print(HEADER + "\n".join(documented_keys(Path(argv[0]))))
    return 0


HEADER = """\
# Every config key the DeepSpeed documentation (the spec) documents, one dotted path a line: the
# output of `python tools/spec/extract_config_keys.py <spec dir>`. Keys of the config of
# deepspeed.init_inference carry the prefix `init_inference.`. tests/docs/test_key_effects.py
# checks that each has a row in the key-effect table of docs/reference/config.md.
"""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
