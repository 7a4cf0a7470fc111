"""OpBuilder: JIT build and cache reuse, build failures, compatibility reasons, SIMD flags."""
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from deepspeed.ops.op_builder import CUDAOpBuilder, OpBuildError, OpBuilder, cpu_simd_flags
from deepspeed.ops.op_builder import builder as builder_module

FIXTURES = Path(__file__).parent / "fixtures"


class TinyOpBuilder(OpBuilder):
    NAME = "ds_test_tiny_op"

    def absolute_name(self):
        return "ds_test_not_prebuilt.tiny_op"

    def sources(self):
        return [str(FIXTURES / "tiny_op.cpp")]  # absolute paths are allowed

    def cxx_args(self):
        return ["-O0", "-std=c++17", "-g0"]


class BrokenOpBuilder(TinyOpBuilder):
    NAME = "ds_test_broken_op"

    def absolute_name(self):
        return "ds_test_not_prebuilt.broken_op"

    def sources(self):
        return [str(FIXTURES / "broken_op.cpp")]


class MissingSourceBuilder(TinyOpBuilder):
    NAME = "ds_test_missing_op"

    def sources(self):
        return ["no/such/kernel.cpp"]


class TinyCUDABuilder(CUDAOpBuilder):
    NAME = "ds_test_cuda_op"

    def sources(self):
        return [str(FIXTURES / "tiny_op.cpp")]


@pytest.fixture
def fresh_loaded_cache(monkeypatch):
    """Builders cache loaded modules per process; tests must see their own builds."""
    monkeypatch.setattr(OpBuilder, "_loaded_modules", {})


def _built_files(ext_dir, name):
    build = Path(ext_dir) / name
    return {p.name: p.stat().st_mtime_ns for p in build.iterdir()
            if p.suffix in (".so", ".o", ".ninja")}


def test_jit_build_then_second_load_reuses_the_cache(tmp_path, monkeypatch, fresh_loaded_cache):
    """Also across PATHs that find different ninjas first (the system's, the virtual
    environment's): their build logs hash commands differently, so a build must always run the
    same one or every switch recompiles the op."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    venv_bin = os.path.dirname(sys.executable)
    system_first = os.pathsep.join(["/usr/bin", "/bin", os.environ.get("PATH", "")])
    monkeypatch.setenv("PATH", system_first)
    tiny = TinyOpBuilder()
    assert tiny.is_compatible(), tiny.incompatible_reason
    assert not tiny.is_installed()
    module = tiny.load(verbose=False)
    assert module.add(2, 40) == 42
    assert tiny.load(verbose=False) is module  # same process: no second import
    first = _built_files(tmp_path, tiny.NAME)
    assert any(name.endswith(".so") for name in first), first

    # a new process must find the build under TORCH_EXTENSIONS_DIR and not recompile it
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_builder import TinyOpBuilder
        print(TinyOpBuilder().load(verbose=False).add(1, 2))
    """)
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path),
               PATH=os.pathsep.join([venv_bin, system_first]))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "3"
    assert _built_files(tmp_path, tiny.NAME) == first  # nothing rebuilt or relinked


def test_compile_error_raises_op_build_error_naming_the_op(tmp_path, monkeypatch, fresh_loaded_cache):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    broken = BrokenOpBuilder()
    assert broken.is_compatible()  # the sources exist; only compiling reveals the error
    with pytest.raises(OpBuildError) as err:
        broken.jit_load(verbose=False)
    message = str(err.value)
    assert "ds_test_broken_op" in message
    assert "broken_op.cpp" in message
    assert "error" in message.lower()
    assert isinstance(err.value, RuntimeError)


def test_missing_sources_make_the_op_incompatible_without_compiling(tmp_path, monkeypatch,
                                                                     fresh_loaded_cache):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    missing = MissingSourceBuilder()
    assert missing.is_compatible() is False
    assert "no/such/kernel.cpp" in missing.incompatible_reason
    with pytest.raises(OpBuildError, match="ds_test_missing_op.*source files missing"):
        missing.load(verbose=False)
    assert not (tmp_path / missing.NAME).exists()


def test_missing_compiler_is_a_reason(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/bin/g++")
    tiny = TinyOpBuilder()
    assert tiny.is_compatible() is False
    assert "no C++ compiler" in tiny.incompatible_reason
    assert "/nonexistent/bin/g++" in tiny.incompatible_reason


@pytest.mark.skipif(torch.version.cuda is not None, reason="checks the CPU-torch reason")
def test_cuda_builder_is_incompatible_with_cpu_torch():
    cuda = TinyCUDABuilder()
    assert cuda.is_compatible() is False
    assert "without CUDA" in cuda.incompatible_reason


def test_cuda_version_mismatch_and_ds_skip_cuda_check(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(builder_module, "_nvcc_path", lambda: "/opt/cuda/bin/nvcc")
    monkeypatch.setattr(builder_module, "nvcc_version", lambda nvcc=None: (13, 0))
    monkeypatch.delenv("DS_SKIP_CUDA_CHECK", raising=False)
    cuda = TinyCUDABuilder()
    assert cuda.is_compatible() is False
    assert "13.0 does not match" in cuda.incompatible_reason
    assert "12.4" in cuda.incompatible_reason
    monkeypatch.setenv("DS_SKIP_CUDA_CHECK", "1")
    assert cuda.is_compatible() is True, cuda.incompatible_reason
    assert cuda.incompatible_reason == ""
    monkeypatch.setattr(builder_module, "_nvcc_path", lambda: None)
    assert cuda.is_compatible() is False
    assert "nvcc was not found" in cuda.incompatible_reason


def test_builder_extensions_carry_sources_and_flags():
    ext = TinyOpBuilder().builder()
    assert ext.name == "ds_test_not_prebuilt.tiny_op"
    # setuptools rejects absolute source paths: they are relative to the working directory
    assert [Path(s).resolve() for s in ext.sources] == [FIXTURES / "tiny_op.cpp"]
    assert all(not os.path.isabs(s) for s in ext.sources if str(FIXTURES).startswith(os.getcwd()))
    assert "-std=c++17" in ext.extra_compile_args["cxx"]
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        with pytest.raises(OpBuildError, match="ds_test_cuda_op.*CUDA_HOME"):
            TinyCUDABuilder().builder()
    else:
        cuda_ext = TinyCUDABuilder().builder()
        assert "--use_fast_math" in cuda_ext.extra_compile_args["nvcc"]


def test_builder_needs_a_name():
    class Nameless(OpBuilder):
        pass

    with pytest.raises(ValueError, match="Nameless.NAME"):
        Nameless()


def test_cpu_simd_flags_match_the_cpu():
    flags = cpu_simd_flags()
    assert cpu_simd_flags() is flags  # computed once
    assert all(isinstance(f, str) and f.startswith("-m") for f in flags)
    cpu_flags = builder_module._cpu_flag_set()
    if platform.machine() == "x86_64" and {"avx2", "fma"} <= cpu_flags:
        assert "-mavx2" in flags and "-mfma" in flags
    if "avx512f" not in cpu_flags:
        assert "-mavx512f" not in flags
    if platform.machine() == "aarch64":
        assert flags == []
    default_args = OpBuilder.cxx_args(TinyOpBuilder())
    assert default_args[:4] == ["-O3", "-std=c++17", "-fopenmp", "-g0"]
    assert default_args[4:] == flags


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="needs Linux's /proc/cpuinfo")
def test_cpu_flags_come_from_proc_without_starting_py_cpuinfo(monkeypatch):
    """py-cpuinfo starts a Python subprocess per call, in every rank that loads an op."""
    import cpuinfo

    def refuse():
        raise AssertionError("py-cpuinfo was asked although /proc/cpuinfo has the flags")

    monkeypatch.setattr(cpuinfo, "get_cpu_info", refuse)
    assert builder_module._cpu_flag_set()


def test_a_fresh_checkout_of_the_same_sources_reuses_the_build(tmp_path, monkeypatch,
                                                               fresh_loaded_cache):
    """A fresh clone's sources are newer than the objects, so ninja alone recompiles them; the
    content stamp skips that, while a changed source still rebuilds."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    source = tmp_path / "tiny_op.cpp"
    source.write_text((FIXTURES / "tiny_op.cpp").read_text())

    class Local(TinyOpBuilder):
        def sources(self):
            return [str(source)]

    def as_a_new_process():
        """Forget what this process loaded: ours, and torch's record of the sources it built
        (with it, torch skips ninja for unchanged sources in the same process, and a broken
        stamp check would go unnoticed)."""
        from torch.utils import cpp_extension
        from torch.utils._cpp_extension_versioner import ExtensionVersioner

        monkeypatch.setattr(OpBuilder, "_loaded_modules", {})
        monkeypatch.setattr(cpp_extension, "JIT_EXTENSION_VERSIONER", ExtensionVersioner())

    as_a_new_process()  # an earlier test built these sources elsewhere: torch would skip ninja
    assert Local().load(verbose=False).add(2, 40) == 42
    first = _built_files(tmp_path / "ext", Local.NAME)
    assert f"{Local.NAME}.so" in first, first
    later = os.stat(source).st_mtime + 3600  # as after `git clone`: sources newer than objects
    os.utime(source, (later, later))
    as_a_new_process()
    assert Local().load(verbose=False).add(1, 2) == 3
    assert _built_files(tmp_path / "ext", Local.NAME) == first  # not recompiled

    source.write_text(source.read_text() + "\n// changed\n")
    as_a_new_process()
    Local().load(verbose=False)
    assert _built_files(tmp_path / "ext", Local.NAME) != first  # a real change rebuilds
