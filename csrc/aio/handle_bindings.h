// The Python methods every DeepNVMe handle has (aio_handle, gds_handle): one definition, so the
// handles keep the same names, arguments and defaults. Handle must provide the getters, submit()
// (buffer, filename, is_read, validate, async_op, file_offset), wait() and the locked-tensor
// methods, and name its tensor argument type (`buffer_type`: torch::Tensor, or py::object for a
// handle that reaches tensors through Python) and the call guard its methods run under
// (`call_guard`: the GIL released around each call, or none for a handle that releases it
// itself). This header needs pybind11 only; a handle built on ATen includes torch first.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

namespace ds_io_bindings {

namespace py = pybind11;

template <typename Handle, typename Class>
void bind_handle_methods(Class& cls)
{
    using rel = typename Handle::call_guard;
    using Buffer = typename Handle::buffer_type;
    cls.def(py::init<std::int64_t, int, bool, bool, int>(), py::arg("block_size") = 1048576,
            py::arg("queue_depth") = 128, py::arg("single_submit") = false,
            py::arg("overlap_events") = false, py::arg("intra_op_parallelism") = 1)
        .def("get_block_size", &Handle::get_block_size)
        .def("get_queue_depth", &Handle::get_queue_depth)
        .def("get_single_submit", &Handle::get_single_submit)
        .def("get_overlap_events", &Handle::get_overlap_events)
        .def("get_intra_op_parallelism", &Handle::get_intra_op_parallelism)
        .def("get_alignment", &Handle::get_alignment)
        .def("sync_pread",
             [](Handle& h, const Buffer& b, const std::string& f, std::int64_t off) {
                 return h.submit(b, f, true, false, false, off);
             },
             py::arg("buffer"), py::arg("filename"), py::arg("file_offset") = 0, rel(),
             "Blocking read of the file bytes at file_offset into buffer; returns 1")
        .def("sync_pwrite",
             [](Handle& h, const Buffer& b, const std::string& f, std::int64_t off) {
                 return h.submit(b, f, false, false, false, off);
             },
             py::arg("buffer"), py::arg("filename"), py::arg("file_offset") = 0, rel(),
             "Blocking write of buffer's bytes at file_offset; returns 1")
        .def("async_pread",
             [](Handle& h, const Buffer& b, const std::string& f, std::int64_t off) {
                 return h.submit(b, f, true, false, true, off);
             },
             py::arg("buffer"), py::arg("filename"), py::arg("file_offset") = 0, rel(),
             "Queues a read and returns 0; wait() completes it")
        .def("async_pwrite",
             [](Handle& h, const Buffer& b, const std::string& f, std::int64_t off) {
                 return h.submit(b, f, false, false, true, off);
             },
             py::arg("buffer"), py::arg("filename"), py::arg("file_offset") = 0, rel(),
             "Queues a write and returns 0; wait() completes it")
        .def("pread",
             [](Handle& h, const Buffer& b, const std::string& f, bool validate,
                bool async_op, std::int64_t off) { return h.submit(b, f, true, validate, async_op, off); },
             py::arg("buffer"), py::arg("filename"), py::arg("validate") = false,
             py::arg("async_op") = false, py::arg("file_offset") = 0, rel())
        .def("pwrite",
             [](Handle& h, const Buffer& b, const std::string& f, bool validate,
                bool async_op, std::int64_t off) { return h.submit(b, f, false, validate, async_op, off); },
             py::arg("buffer"), py::arg("filename"), py::arg("validate") = false,
             py::arg("async_op") = false, py::arg("file_offset") = 0, rel())
        .def("read",
             [](Handle& h, const Buffer& b, const std::string& f, bool validate,
                std::int64_t off) { return h.submit(b, f, true, validate, false, off); },
             py::arg("buffer"), py::arg("filename"), py::arg("validate") = false,
             py::arg("file_offset") = 0, rel())
        .def("write",
             [](Handle& h, const Buffer& b, const std::string& f, bool validate,
                std::int64_t off) { return h.submit(b, f, false, validate, false, off); },
             py::arg("buffer"), py::arg("filename"), py::arg("validate") = false,
             py::arg("file_offset") = 0, rel())
        .def("wait", &Handle::wait, rel(), "Joins every queued op; returns how many completed")
        .def("new_cpu_locked_tensor", &Handle::new_cpu_locked_tensor, py::arg("num_elem"),
             py::arg("example_tensor"),
             "1-D page-aligned, locked host tensor of example_tensor's dtype")
        .def("free_cpu_locked_tensor", &Handle::free_cpu_locked_tensor, py::arg("tensor"))
        .def("is_pinned", &Handle::is_pinned, py::arg("tensor"));
}

}  // namespace ds_io_bindings
