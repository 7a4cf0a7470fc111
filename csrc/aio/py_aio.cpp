// Python bindings of the async_io op (names and defaults follow the DeepNVMe tutorial).
#include <torch/extension.h>

#include "aio_handle.h"

namespace py = pybind11;
using ds_aio::AioHandle;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "DeepNVMe async I/O: moves raw tensor bytes to and from files";
    m.def("backend", &ds_aio::backend_name, "I/O engine in use: 'libaio' or 'pthread-pread'");

    using rel = py::call_guard<py::gil_scoped_release>;
    py::class_<AioHandle>(m, "aio_handle",
                          "Handle for tensor <-> file I/O split across intra_op_parallelism threads")
        .def(py::init<std::int64_t, int, bool, bool, int>(), py::arg("block_size") = 1048576,
             py::arg("queue_depth") = 128, py::arg("single_submit") = false,
             py::arg("overlap_events") = false, py::arg("intra_op_parallelism") = 1)
        .def("get_block_size", &AioHandle::get_block_size)
        .def("get_queue_depth", &AioHandle::get_queue_depth)
        .def("get_single_submit", &AioHandle::get_single_submit)
        .def("get_overlap_events", &AioHandle::get_overlap_events)
        .def("get_intra_op_parallelism", &AioHandle::get_intra_op_parallelism)
        .def("get_alignment", &AioHandle::get_alignment)
        .def("sync_pread",
             [](AioHandle& h, const torch::Tensor& b, const std::string& f, std::int64_t off) {
                 return h.submit(b, f, true, false, false, off);
             },
             py::arg("buffer"), py::arg("filename"), py::arg("file_offset") = 0, rel(),
             "Blocking read of the file bytes at file_offset into buffer; returns 1")
        .def("sync_pwrite",
             [](AioHandle& h, const torch::Tensor& b, const std::string& f, std::int64_t off) {
                 return h.submit(b, f, false, false, false, off);
             },
             py::arg("buffer"), py::arg("filename"), py::arg("file_offset") = 0, rel(),
             "Blocking write of buffer's bytes at file_offset; returns 1")
        .def("async_pread",
             [](AioHandle& h, const torch::Tensor& b, const std::string& f, std::int64_t off) {
                 return h.submit(b, f, true, false, true, off);
             },
             py::arg("buffer"), py::arg("filename"), py::arg("file_offset") = 0, rel(),
             "Queues a read and returns 0; wait() completes it")
        .def("async_pwrite",
             [](AioHandle& h, const torch::Tensor& b, const std::string& f, std::int64_t off) {
                 return h.submit(b, f, false, false, true, off);
             },
             py::arg("buffer"), py::arg("filename"), py::arg("file_offset") = 0, rel(),
             "Queues a write and returns 0; wait() completes it")
        .def("pread",
             [](AioHandle& h, const torch::Tensor& b, const std::string& f, bool validate,
                bool async_op, std::int64_t off) { return h.submit(b, f, true, validate, async_op, off); },
             py::arg("buffer"), py::arg("filename"), py::arg("validate") = false,
             py::arg("async_op") = false, py::arg("file_offset") = 0, rel())
        .def("pwrite",
             [](AioHandle& h, const torch::Tensor& b, const std::string& f, bool validate,
                bool async_op, std::int64_t off) { return h.submit(b, f, false, validate, async_op, off); },
             py::arg("buffer"), py::arg("filename"), py::arg("validate") = false,
             py::arg("async_op") = false, py::arg("file_offset") = 0, rel())
        .def("read",
             [](AioHandle& h, const torch::Tensor& b, const std::string& f, bool validate,
                std::int64_t off) { return h.submit(b, f, true, validate, false, off); },
             py::arg("buffer"), py::arg("filename"), py::arg("validate") = false,
             py::arg("file_offset") = 0, rel())
        .def("write",
             [](AioHandle& h, const torch::Tensor& b, const std::string& f, bool validate,
                std::int64_t off) { return h.submit(b, f, false, validate, false, off); },
             py::arg("buffer"), py::arg("filename"), py::arg("validate") = false,
             py::arg("file_offset") = 0, rel())
        .def("wait", &AioHandle::wait, rel(), "Joins every queued op; returns how many completed")
        .def("new_cpu_locked_tensor", &AioHandle::new_cpu_locked_tensor, py::arg("num_elem"),
             py::arg("example_tensor"),
             "1-D page-aligned, mlock'ed host tensor of example_tensor's dtype")
        .def("free_cpu_locked_tensor", &AioHandle::free_cpu_locked_tensor, py::arg("tensor"))
        .def("is_pinned", &AioHandle::is_pinned, py::arg("tensor"));
}
