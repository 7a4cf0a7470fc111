// Python bindings of the async_io op (names and defaults follow the DeepNVMe tutorial).
// pybind11 only: see aio_handle.h for why the op does without the ATen headers.
#include "aio_handle.h"
#include "handle_bindings.h"

namespace py = pybind11;
using ds_aio::AioHandle;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "DeepNVMe async I/O: moves raw tensor bytes to and from files";
    m.def("backend", &ds_aio::backend_name, "I/O engine in use: 'libaio' or 'pthread-pread'");

    py::class_<AioHandle> cls(m, "aio_handle",
                              "Handle for tensor <-> file I/O split across intra_op_parallelism threads");
    ds_io_bindings::bind_handle_methods<AioHandle>(cls);
    ds_aio::bind_locked_buffer(m);
}
