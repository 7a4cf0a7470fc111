// Python bindings of the gds op: the aio handle's methods (handle_bindings.h), plus the
// GPUDirect-only device-buffer registration methods.
#include <torch/extension.h>

#include "gds_handle.h"
#include "handle_bindings.h"

namespace py = pybind11;
using ds_gds::GdsHandle;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "DeepNVMe GPUDirect Storage: moves raw tensor bytes between GPU memory and files";
    m.def("backend", &ds_gds::backend_name, "I/O engine in use: 'cufile'");

    py::class_<GdsHandle> cls(m, "gds_handle", "cuFile handle with the aio handle's API");
    ds_io_bindings::bind_handle_methods<GdsHandle>(cls);
    cls.def("new_pinned_device_tensor", &GdsHandle::new_pinned_device_tensor, py::arg("num_elem"),
            py::arg("example_tensor"), "CUDA tensor registered with cuFile")
        .def("free_pinned_device_tensor", &GdsHandle::free_pinned_device_tensor, py::arg("tensor"))
        .def("pin_device_tensor", &GdsHandle::pin_device_tensor, py::arg("tensor"))
        .def("unpin_device_tensor", &GdsHandle::unpin_device_tensor, py::arg("tensor"));
}
