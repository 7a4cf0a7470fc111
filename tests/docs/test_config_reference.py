"""The configuration reference (docs/reference/config.md) is generated from the config models:
the committed page must be exactly what tools/docs/gen_config_reference.py writes today, and
every key must be described (by its model or by tools/docs/config_descriptions.py)."""
from docs_paths import DOCS

import gen_config_reference


def test_committed_config_reference_is_current():
    committed = (DOCS / "reference" / "config.md").read_text(encoding="utf-8")
    assert committed == gen_config_reference.render(), (
        "docs/reference/config.md is stale: run `python tools/docs/gen_config_reference.py` "
        "and commit the result")


def test_every_config_key_is_described():
    assert gen_config_reference.undescribed() == [], (
        "config keys without a description: give the field a description= or add an entry to "
        "tools/docs/config_descriptions.py")


def test_no_description_names_a_missing_key():
    assert gen_config_reference.stale_descriptions() == []


def test_reference_lists_core_and_plugin_keys_with_owner_type_and_default():
    text = gen_config_reference.render()
    # one key of the core, one of a plugin, one deprecated spelling, one key without effect
    assert "| `train_micro_batch_size_per_gpu` | int \\| null | `null` |" in text
    zero = text.split("## `zero_optimization`", 1)[1].split("\n## ", 1)[0]
    assert "Owned by the `zero` plugin." in zero
    assert "| `zero_optimization.stage` | 0 \\| 1 \\| 2 \\| 3 | `0` |" in zero
    assert "Deprecated spelling: `cpu_offload`." in zero
    assert "**No effect here**" in zero
