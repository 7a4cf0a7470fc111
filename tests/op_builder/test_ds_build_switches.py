"""Every ``DS_BUILD_*`` switch of the install docs selects a registered op builder, and
``ds_report`` lists that op with a status (a reason whenever it is not compatible); the builders
that cannot build here refuse with their reason rather than pretending."""
from pathlib import Path

import pytest

from deepspeed.accelerator import get_accelerator, installed_op_builders
from deepspeed.env_report import op_report
from deepspeed.ops.op_builder import OpBuildError
from deepspeed.ops.op_builder.aot import BUILD_ALL_VAR, select_ops

SWITCHES = [line.strip() for line in
            (Path(__file__).parent / "fixtures" / "ds_build_switches.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
OP_SWITCHES = [name for name in SWITCHES if name != BUILD_ALL_VAR]


@pytest.fixture(scope="module")
def builders():
    """BUILD_VAR -> builder instance, for every registered builder."""
    found = {}
    for class_name in installed_op_builders():
        builder = get_accelerator().create_op_builder(class_name)
        assert builder.BUILD_VAR not in found, f"two builders answer {builder.BUILD_VAR}"
        found[builder.BUILD_VAR] = builder
    return found


@pytest.fixture(scope="module")
def report():
    return op_report([])


def test_the_docs_list_is_the_vendored_one():
    assert len(SWITCHES) == 16 and SWITCHES[0] == BUILD_ALL_VAR
    assert {"DS_BUILD_AIO", "DS_BUILD_CCL_COMM", "DS_BUILD_QUANTIZER",
            "DS_BUILD_STOCHASTIC_TRANSFORMER"} <= set(SWITCHES)


@pytest.mark.parametrize("switch", OP_SWITCHES)
def test_switch_selects_a_builder_listed_with_a_status(switch, builders, report):
    assert switch in builders, f"no registered op builder answers {switch}"
    builder = builders[switch]
    rows = [i for i, line in enumerate(report) if line.split(".")[0].strip() == builder.NAME]
    assert len(rows) == 1, f"ds_report has no single row for {builder.NAME} ({switch})"
    row = report[rows[0]]
    assert row.endswith(("[OKAY]", "[NO]", "[FAIL]")), row
    if not row.endswith("[OKAY]"):
        assert report[rows[0] + 1].startswith("    reason: ") and len(report[rows[0] + 1]) > 20
    # an install with only this switch set knows it (a typo'd switch is an error instead)
    selected, skipped = select_ops([type(b) for b in builders.values()], {switch: "1"})
    assert [b.NAME for b in selected] + [name for name, _ in skipped] == [builder.NAME]


@pytest.mark.parametrize("switch", ["DS_BUILD_CCL_COMM", "DS_BUILD_RANDOM_LTD"])
def test_ops_without_a_native_build_refuse_with_their_reason(switch, builders):
    builder = builders[switch]
    assert not builder.is_compatible()
    assert "instead" in builder.incompatible_reason or "runs as" in builder.incompatible_reason
    with pytest.raises(OpBuildError, match=f"op '{builder.NAME}' is not available"):
        builder.load()


def test_unknown_switch_is_refused(builders):
    with pytest.raises(ValueError, match="unknown op build switch.*DS_BUILD_FUSED_LIONS"):
        select_ops([type(b) for b in builders.values()], {"DS_BUILD_FUSED_LIONS": "1"})
