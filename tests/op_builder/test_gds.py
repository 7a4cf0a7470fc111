"""GDSBuilder / gds_handle (GPUDirect Storage over cuFile): refused with the missing piece and
the alternative where cuFile or a CUDA torch is missing; the sources compile where the headers
are; on a CUDA machine with cuFile the handle round-trips device and host tensors exactly."""
import os
import shutil
import subprocess
import sysconfig

import pytest
import torch

from deepspeed.ops import gds
from deepspeed.ops.op_builder import OpBuildError
from deepspeed.ops.op_builder import gds as gds_builder
from deepspeed.ops.op_builder.gds import GDSBuilder


def test_refusal_names_the_missing_piece_and_the_aio_handle(monkeypatch):
    monkeypatch.setattr(gds_builder, "find_cufile", lambda: (None, None))
    builder = GDSBuilder()
    assert not builder.is_compatible()
    reason = builder.incompatible_reason
    assert "cufile.h was not found" in reason and "libcufile.so was not found" in reason
    assert "use deepspeed.ops.aio.aio_handle" in reason
    if torch.version.cuda is None:
        assert "without CUDA" in reason
    with pytest.raises(OpBuildError, match="gds_handle needs NVIDIA GPUDirect Storage .*cufile.h"):
        gds.gds_handle()
    with pytest.raises(OpBuildError, match="op 'gds' cannot be built on this machine.*aio_handle"):
        builder.load(verbose=False)
    assert gds.is_available() is False


def test_cufile_is_found_under_cufile_home(tmp_path, monkeypatch):
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cufile.h").write_text("")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libcufile_rdma.so.1").write_text("")
    (tmp_path / "lib" / "libcufile.so.0").write_text("")
    monkeypatch.setenv("CUFILE_HOME", str(tmp_path))
    include, library = gds_builder.find_cufile()
    assert include == str(tmp_path / "include")
    assert library == str(tmp_path / "lib" / "libcufile.so.0")
    builder = GDSBuilder()
    assert str(tmp_path / "include") in builder.absolute_include_paths()
    assert f"-l:libcufile.so.0" in builder.extra_ldflags()
    assert builder.BUILD_VAR == "DS_BUILD_GDS"
    if torch.version.cuda is None:  # the headers alone are not enough: a CUDA torch is
        assert not builder.is_compatible() and "cufile.h" not in builder.incompatible_reason


def _compile_inputs():
    include, _ = gds_builder.find_cufile()
    cuda = gds_builder.cuda_runtime_include()
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if include is None or cuda is None or cxx is None:
        pytest.skip("needs cufile.h (CUFILE_HOME / nvidia-cufile), the CUDA toolkit's headers and "
                    "a C++ compiler")
    return cxx, [include, cuda]


@pytest.mark.timeout(900)  # a syntax check of torch's headers: minutes on a loaded 2-core machine
@pytest.mark.parametrize("source", GDSBuilder().sources())
def test_sources_compile_where_cufile_headers_are(source):
    """A syntax check against torch's (CPU) headers, the CUDA runtime's and cuFile's: the op uses
    no torch CUDA header, so it must compile wherever those three are."""
    cxx, includes = _compile_inputs()
    from torch.utils import cpp_extension

    builder = GDSBuilder()
    dirs = cpp_extension.include_paths() + builder.absolute_include_paths() + includes
    cmd = [cxx, "-fsyntax-only", "-std=c++17", "-w", f"-DTORCH_EXTENSION_NAME={builder.NAME}",
           *[f"-I{d}" for d in dirs], f"-I{sysconfig.get_paths()['include']}",
           str(builder.absolute_sources()[builder.sources().index(source)])]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{source} does not compile:\n{result.stderr[-4000:]}"


needs_gds = pytest.mark.skipif(not torch.cuda.is_available() or not gds.is_available(),
                               reason="needs a CUDA GPU, a CUDA torch and cuFile")


@needs_gds
def test_device_and_host_round_trip(tmp_path):
    h = gds.gds_handle(block_size=1 << 16, intra_op_parallelism=2)
    assert (h.get_block_size(), h.get_queue_depth(), h.get_intra_op_parallelism()) == (1 << 16, 128, 2)
    src = torch.randint(0, 256, (3 * (1 << 20) + 5,), dtype=torch.uint8, device="cuda")
    path = str(tmp_path / "d.bin")
    assert h.sync_pwrite(src, path) == 1
    assert os.path.getsize(path) == src.numel()
    back = torch.empty_like(src)
    assert h.sync_pread(back, path) == 1 and torch.equal(back, src)
    pinned = h.new_pinned_device_tensor(src.numel(), src)
    assert h.is_pinned(pinned)
    assert h.async_pread(pinned, path) == 0 and h.wait() == 1 and torch.equal(pinned, src)
    assert h.free_pinned_device_tensor(pinned) and not h.is_pinned(pinned)
    host = torch.randn(1000, 7)
    assert h.pwrite(host, path, True, False, 4096) == 1
    host_back = torch.empty_like(host)
    assert h.read(host_back, path, True, 4096) == 1 and torch.equal(host_back, host)
    with pytest.raises(ValueError, match="holds"):
        h.sync_pread(torch.empty(10 << 20, dtype=torch.uint8, device="cuda"), path)
