// Python bindings of the gds op: the aio handle's names and defaults, plus the GPUDirect-only
// device-buffer registration methods.
#include <torch/extension.h>

#include "gds_handle.h"

namespace py = pybind11;
using ds_gds::GdsHandle;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "DeepNVMe GPUDirect Storage: moves raw tensor bytes between GPU memory and files";
    m.def("backend", &ds_gds::backend_name, "I/O engine in use: 'cufile'");

    using rel = py::call_guard<py::gil_scoped_release>;
    py::class_<GdsHandle>(m, "gds_handle", "cuFile handle with the aio handle's API")
        .def(py::init<std::int64_t, int, bool, bool, int>(), py::arg("block_size") = 1048576,
             py::arg("queue_depth") = 128, py::arg("single_submit") = false,
             py::arg("overlap_events") = false, py::arg("intra_op_parallelism") = 1)
        .def("get_block_size", &GdsHandle::get_block_size)
        .def("get_queue_depth", &GdsHandle::get_queue_depth)
        .def("get_single_submit", &GdsHandle::get_single_submit)
        .def("get_overlap_events", &GdsHandle::get_overlap_events)
        .def("get_intra_op_parallelism", &GdsHandle::get_intra_op_parallelism)
        .def("get_alignment", &GdsHandle::get_alignment)
        .def("sync_pread",
             [](GdsHandle& h, const torch::Tensor& b, const std::string& f, std::int64_t off) {
                 return h.submit(b, f, true, false, false, off);
             },
             py::arg("buffer"), py::arg("filename"), py::arg("file_offset") = 0, rel())
        .def("sync_pwrite",
             [](GdsHandle& h, const torch::Tensor& b, const std::string& f, std::int64_t off) {
                 return h.submit(b, f, false, false, false, off);
             },
             py::arg("buffer"), py::arg("filename"), py::arg("file_offset") = 0, rel())
        .def("async_pread",
             [](GdsHandle& h, const torch::Tensor& b, const std::string& f, std::int64_t off) {
                 return h.submit(b, f, true, false, true, off);
             },
             py::arg("buffer"), py::arg("filename"), py::arg("file_offset") = 0, rel())
        .def("async_pwrite",
             [](GdsHandle& h, const torch::Tensor& b, const std::string& f, std::int64_t off) {
                 return h.submit(b, f, false, false, true, off);
             },
             py::arg("buffer"), py::arg("filename"), py::arg("file_offset") = 0, rel())
        .def("pread",
             [](GdsHandle& h, const torch::Tensor& b, const std::string& f, bool validate,
                bool async_op, std::int64_t off) { return h.submit(b, f, true, validate, async_op, off); },
             py::arg("buffer"), py::arg("filename"), py::arg("validate") = false,
             py::arg("async_op") = false, py::arg("file_offset") = 0, rel())
        .def("pwrite",
             [](GdsHandle& h, const torch::Tensor& b, const std::string& f, bool validate,
                bool async_op, std::int64_t off) { return h.submit(b, f, false, validate, async_op, off); },
             py::arg("buffer"), py::arg("filename"), py::arg("validate") = false,
             py::arg("async_op") = false, py::arg("file_offset") = 0, rel())
        .def("read",
             [](GdsHandle& h, const torch::Tensor& b, const std::string& f, bool validate,
                std::int64_t off) { return h.submit(b, f, true, validate, false, off); },
             py::arg("buffer"), py::arg("filename"), py::arg("validate") = false,
             py::arg("file_offset") = 0, rel())
        .def("write",
             [](GdsHandle& h, const torch::Tensor& b, const std::string& f, bool validate,
                std::int64_t off) { return h.submit(b, f, false, validate, false, off); },
             py::arg("buffer"), py::arg("filename"), py::arg("validate") = false,
             py::arg("file_offset") = 0, rel())
        .def("wait", &GdsHandle::wait, rel(), "Joins every queued op; returns how many completed")
        .def("new_cpu_locked_tensor", &GdsHandle::new_cpu_locked_tensor, py::arg("num_elem"),
             py::arg("example_tensor"))
        .def("free_cpu_locked_tensor", &GdsHandle::free_cpu_locked_tensor, py::arg("tensor"))
        .def("is_pinned", &GdsHandle::is_pinned, py::arg("tensor"))
        .def("new_pinned_device_tensor", &GdsHandle::new_pinned_device_tensor, py::arg("num_elem"),
             py::arg("example_tensor"), "CUDA tensor registered with cuFile")
        .def("free_pinned_device_tensor", &GdsHandle::free_pinned_device_tensor, py::arg("tensor"))
        .def("pin_device_tensor", &GdsHandle::pin_device_tensor, py::arg("tensor"))
        .def("unpin_device_tensor", &GdsHandle::unpin_device_tensor, py::arg("tensor"));
}
