"""Builder discovery through `deepspeed.op_builders` entry points, and the ds_report op table."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from deepspeed.env_report import op_report
from deepspeed.ops.op_builder import get_op_builder

VENDOR_SOURCE = Path(__file__).parent / "fixtures" / "ds_vendor_ops"


def test_ds_report_lists_a_third_party_builder_with_its_provider(install_fixture_package):
    install_fixture_package("ds_example_accelerator")
    from ds_example_accelerator import ExampleOpBuilder

    assert get_op_builder("ExampleOpBuilder") is ExampleOpBuilder
    assert get_op_builder("example_op") is ExampleOpBuilder
    warnings = []
    text = "\n".join(op_report(warnings))
    row = next(line for line in text.splitlines() if line.startswith("example_op"))
    assert row.endswith("[OKAY]")
    assert "provided by ds_example_accelerator:ExampleOpBuilder" in text


def test_unknown_builder_names():
    assert get_op_builder("NoSuchBuilder") is None
    assert get_op_builder("no_such_op") is None
    with pytest.raises(ValueError, match="non-empty string"):
        get_op_builder("")


def test_op_table_shows_reasons_for_incompatible_ops():
    warnings = []
    lines = op_report(warnings)
    text = "\n".join(lines)
    assert "DeepSpeed C++/CUDA extension op report" in text
    assert "ninja" in text and "C++ compiler" in text and "nvcc" in text
    header = next(i for i, line in enumerate(lines) if line.startswith("op name"))
    rows = [line for line in lines[header + 2:] if not line.startswith(" ")]
    assert rows, text
    for i, line in enumerate(lines[header + 2:], start=header + 2):
        if line.rstrip().endswith(("[NO]", "[FAIL]")) and not line.startswith(" "):
            # an op that is not compatible is always followed by why
            assert lines[i + 1].startswith("    ") and "reason: " in "\n".join(lines[i + 1:i + 3]), text


@pytest.fixture(scope="module")
def vendor_site(tmp_path_factory):
    """ds_vendor_ops installed privately: it replaces FusedAdamBuilder, so it must only be seen
    by the subprocesses of these tests, never by the rest of the session."""
    target = tmp_path_factory.mktemp("site-ds-vendor-ops")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(VENDOR_SOURCE)], check=True)
    return target


def _run_with(site, code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_vendor_package_overrides_a_builtin_builder(vendor_site):
    out = _run_with(vendor_site, """
        from deepspeed.ops.op_builder import get_op_builder
        from deepspeed.accelerator import get_accelerator
        by_class = get_op_builder("FusedAdamBuilder")
        by_name = get_op_builder("fused_adam")
        print(by_class.__module__, by_class is by_name)
        print(get_accelerator().create_op_builder("FusedAdamBuilder").load().vendor)
    """)
    assert out.splitlines() == ["ds_vendor_ops True", "ds_vendor_ops"]


def test_ds_report_shows_the_override(vendor_site):
    out = _run_with(vendor_site, """
        from deepspeed.env_report import cli_main
        cli_main([])
    """)
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("fused_adam"))
    assert lines[i].endswith("[OKAY]")
    assert lines[i + 1].strip() == "provided by ds_vendor_ops:VendorFusedAdamBuilder"


def test_op_table_says_which_aio_engine_is_active():
    from deepspeed.ops.op_builder.async_io import AsyncIOBuilder

    lines = op_report([])
    row = next(i for i, line in enumerate(lines) if line.startswith("async_io"))
    assert lines[row + 1] == f"    engine: {AsyncIOBuilder().libaio_status()}"


def test_op_table_columns_line_up_under_their_headers():
    """[YES] and [NO] start in the same column, under "installed"; the compatibility values
    under "compatible", whatever the length of the op's name."""
    from deepspeed.env_report import op_table

    rows = [("a", "[YES]", "[OKAY]", "", "deepspeed.x"),
            ("a_much_longer_op_name", "[NO]", "[NO]", "no GPU", "deepspeed.x"),
            ("mid_name", "[YES]", "[FAIL]", "broken", "deepspeed.x")]
    lines = op_table(rows)
    header = lines[0]
    table = [line for line in lines[2:] if not line.startswith(" ")]
    assert len(table) == 3
    installed, compatible = header.index("installed"), header.index("compatible")
    for line in table:
        assert line.index("[") == installed, lines
        assert line.index("[", installed + 1) == compatible, lines
    assert [line for line in lines if line.startswith("    reason: ")] == \
        ["    reason: no GPU", "    reason: broken"]
    assert not any("reason" in line for line in op_table(rows, show_reasons=False))


def test_hide_errors_and_warnings_hides_reasons_and_warnings(capsys, monkeypatch):
    from deepspeed import env_report

    monkeypatch.setattr(env_report, "_op_rows", lambda warnings: (
        warnings.append("ninja-like trouble"),
        [("fused_adam", "[NO]", "[NO]", "torch was built without CUDA", "deepspeed.x")])[1])
    env_report.cli_main([])
    shown = capsys.readouterr().out
    assert "reason: torch was built without CUDA" in shown and "Warnings:" in shown
    env_report.cli_main(["--hide_errors_and_warnings"])
    hidden = capsys.readouterr().out
    assert "fused_adam" in hidden and "reason:" not in hidden and "Warnings:" not in hidden
    assert "ninja-like trouble" not in hidden
