"""`ds_report`: what this installation can do, in the form users paste into bug reports.

Everything is discovered, nothing is hard-coded: op builders through the entry-point group
`deepspeed.op_builders`, accelerators through `deepspeed.accelerators`, plugins through
`deepspeed.plugins` (with the config keys that switch each one on).
"""
import argparse
import os
import platform
import shutil
import sys

GREEN_OKAY = "[OKAY]"
NO = "[NO]"
YES = "[YES]"
FAIL = "[FAIL]"
WIDTH = 60


def _dots(label, value, width=WIDTH):
    return f"{label} {'.' * max(3, width - len(label) - len(str(value)) - 2)} {value}"


def _op_rows(warnings):
    """(name, installed, compatible, reason, provider) per registered op builder."""
    from deepspeed.accelerator import get_accelerator, installed_op_builders

    rows = []
    for class_name, target in installed_op_builders().items():
        try:
            builder = get_accelerator().create_op_builder(class_name)
        except Exception as exc:  # one broken builder module must not hide the other ops
            warnings.append(f"op builder '{class_name}' ({target}) could not be created: {exc}")
            rows.append((class_name, NO, FAIL, f"cannot be loaded: {exc}", target))
            continue
        if builder is None:
            warnings.append(f"op builder '{class_name}' is registered but the accelerator "
                            f"'{get_accelerator().name}' cannot create it")
            continue
        name = getattr(builder, "NAME", class_name)
        provider = f"{type(builder).__module__}:{type(builder).__qualname__}"
        installed = getattr(builder, "is_installed", None)
        installed = YES if callable(installed) and installed() else NO
        reason = ""
        try:
            compatible = GREEN_OKAY if builder.is_compatible(verbose=False) else NO
            if compatible == NO:
                reason = getattr(builder, "incompatible_reason", "") or "no reason given"
        except Exception as exc:  # a broken third-party builder must not hide the rest
            compatible = FAIL
            reason = f"is_compatible() raised {exc!r}"
            warnings.append(f"op builder '{name}' raised during is_compatible(): {exc!r}")
        rows.append((name, installed, compatible, reason, provider))
    return rows


def _toolchain_lines():
    from deepspeed.ops.op_builder.builder import compiler_version, nvcc_version

    cxx = os.environ.get("CXX", "c++")
    nvcc = nvcc_version()
    ext_dir = os.environ.get("TORCH_EXTENSIONS_DIR") or \
        "~/.cache/torch_extensions/<python>_<device>/deepspeed/<op>-<source hash> (default)"
    cxx_version = compiler_version(cxx.split()[0]) if cxx.strip() else None
    return [_dots(f"C++ compiler ({cxx})", cxx_version or "not found"),
            _dots("nvcc", f"{nvcc[0]}.{nvcc[1]}" if nvcc else "not found"),
            _dots("DS_SKIP_CUDA_CHECK", os.environ.get("DS_SKIP_CUDA_CHECK", "0")),
            _dots("TORCH_CUDA_ARCH_LIST", os.environ.get("TORCH_CUDA_ARCH_LIST", "(unset)")),
            _dots("torch extensions dir", ext_dir)]


def op_table(rows, show_reasons=True):
    """The op table: the values of each column start in one column on every row and under
    their header (``[YES]`` and ``[NO]`` alike), whatever the lengths of the names."""
    name_width = max([len("op name")] + [len(row[0]) for row in rows]) + 4
    installed_width = len("installed") + 3

    def line(name, installed, compatible):
        return (f"{name} ".ljust(name_width, ".") + " " + f"{installed} ".ljust(installed_width, ".")
                + " " + compatible)

    lines = [line("op name", "installed", "compatible"), "-" * WIDTH]
    if not rows:
        lines.append("(no op builders are registered in 'deepspeed.op_builders')")
    for name, installed, compatible, reason, provider in rows:
        lines.append(line(name, installed, compatible))
        if not provider.startswith("deepspeed."):
            lines.append(f"    provided by {provider}")
        if reason and show_reasons:
            lines.append(f"    reason: {reason}")
    return lines


def op_report(warnings, show_reasons=True):
    lines = ["-" * WIDTH, "DeepSpeed C++/CUDA extension op report", "-" * WIDTH,
             "NOTE: Ops not installed will be just-in-time (JIT) compiled at runtime if needed.",
             "      Op compatibility means that your system meets the required dependencies",
             "      to JIT install the op.", "-" * WIDTH, "JIT compiled ops requires ninja"]
    ninja = shutil.which("ninja")
    lines.append(_dots("ninja", GREEN_OKAY if ninja else FAIL))
    if not ninja:
        warnings.append("ninja is not on PATH: ops cannot be JIT-compiled (pip install ninja)")
    lines.extend(_toolchain_lines())
    lines.append("-" * WIDTH)
    rows = _op_rows(warnings)
    table = op_table(rows, show_reasons)
    for index, row in enumerate(list(table)):  # which I/O engine async_io builds with
        if row.startswith("async_io "):
            table.insert(index + 1, f"    engine: {_aio_engine(warnings)}")
            break
    return lines + table


def _aio_engine(warnings):
    """Which I/O engine async_io builds with: libaio, or the thread-pool pread/pwrite path."""
    from deepspeed.ops.op_builder import get_op_builder

    builder = get_op_builder("async_io")
    status = getattr(builder(), "libaio_status", None) if builder is not None else None
    if status is None:
        return "unknown (the registered async_io builder does not say)"
    return status()


def _shm_size():
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return "unknown"
    return f"{stat.f_blocks * stat.f_frsize / 2**30:.2f} GB"


def _cpu_description():
    try:
        import cpuinfo

        info = cpuinfo.get_cpu_info()
    except Exception as exc:  # py-cpuinfo shells out; report instead of failing the report
        return f"unknown ({exc!r})", ""
    flags = set(info.get("flags", []))
    simd = [f for f in ("avx512f", "avx2", "avx", "neon", "asimd") if f in flags]
    return info.get("brand_raw", "unknown"), ",".join(simd) or "none"


def environment_report(warnings):
    import torch

    import deepspeed
    from deepspeed.accelerator import get_accelerator, installed_accelerators

    acc = get_accelerator()
    from deepspeed.git_version_info import git_info

    githash, branch = git_info()
    cpu, simd = _cpu_description()
    lines = ["DeepSpeed general environment info:",
             _dots("torch install path", os.path.dirname(torch.__file__)),
             _dots("torch version", torch.__version__),
             _dots("deepspeed install path", os.path.dirname(deepspeed.__file__)),
             _dots("deepspeed info", f"{deepspeed.__version__}, {githash}, {branch}"),
             _dots("python version", platform.python_version()),
             _dots("accelerator", f"{acc.name} (backend {acc.communication_backend_name()})"),
             _dots("installed accelerators", ", ".join(installed_accelerators()) or "none"),
             _dots("torch cuda version", torch.version.cuda or "none (CPU build)"),
             _dots("cpu", cpu),
             _dots("cpu simd", simd),
             _dots("shared memory (/dev/shm) size", _shm_size())]
    return lines


def plugin_report(warnings):
    from deepspeed.plugin_manager import PluginCatalog, PluginError, installed_plugins

    lines = ["DeepSpeed plugins (entry-point group 'deepspeed.plugins'):"]
    specs = installed_plugins()
    if not specs:
        return lines + ["  (none installed)"]
    try:
        catalog = PluginCatalog(specs)
    except PluginError as exc:
        warnings.append(str(exc))
        return lines + [f"  {name} ({spec.distribution} {spec.version})"
                        for name, spec in specs.items()]
    for name, spec in specs.items():
        keys = catalog.switches_of(name) or "(no config section)"
        lines.append(_dots(f"  {name} [{spec.distribution} {spec.version}]",
                           f"enabled by: {keys}"))
    return lines


def main(hide_operator_status=False, hide_errors_and_warnings=False):
    warnings = []
    sections = []
    if not hide_operator_status:
        sections.append(op_report(warnings, show_reasons=not hide_errors_and_warnings))
    sections.append(environment_report(warnings))
    sections.append(plugin_report(warnings))
    for lines in sections:
        print("\n".join(lines))
        print("-" * WIDTH)
    if warnings and not hide_errors_and_warnings:
        print("Warnings:")
        for w in warnings:
            print(f"  - {w}")
    return 0


def cli_main(argv=None):
    parser = argparse.ArgumentParser(prog="ds_report",
                                     description="Report the DeepSpeed environment and ops.")
    parser.add_argument("--hide_operator_status", action="store_true",
                        help="Suppress the op compatibility table.")
    parser.add_argument("--hide_errors_and_warnings", action="store_true",
                        help="Suppress warning and error messages (the closing warnings and "
                             "each incompatible op's reason).")
    args = parser.parse_args(argv)
    return main(args.hide_operator_status, args.hide_errors_and_warnings)


if __name__ == "__main__":
    sys.exit(cli_main())
