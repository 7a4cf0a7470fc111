// Python binding of the multi-tensor Lion kernel: validates the tensor lists (the kernel trusts
// raw pointers), gathers pointers and sizes, and launches on torch's current CUDA stream.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <vector>

#include "tensor_lists.h"

namespace ds_optim {
const char* launch_multi_tensor_lion(int dtype, int state_dtype, int64_t min_share,
                                     int num_tensors, void* const* const* lists,
                                     const int64_t* sizes, double lr, double beta1, double beta2,
                                     double weight_decay, cudaStream_t stream);
}

void multi_tensor_lion(int64_t chunk_size, const std::vector<std::vector<at::Tensor>>& lists,
                       double lr, double beta1, double beta2, double weight_decay) {
    TORCH_CHECK(lists.size() == 3, "multi_tensor_lion: expected 3 tensor lists ",
                "(params, grads, exp_avgs), got ", lists.size());
    if (lists[0].empty()) return;
    static const char* names[3] = {"params", "grads", "exp_avgs"};
    const ds_optim::CheckedLists checked = ds_optim::check_tensor_lists(
        "multi_tensor_lion", {&lists[0], &lists[1], &lists[2]}, names);
    const at::Tensor& first = lists[0][0];
    const c10::cuda::CUDAGuard guard(first.device());
    const char* err = ds_optim::launch_multi_tensor_lion(
        ds_optim::dtype_code("multi_tensor_lion", first.scalar_type()),
        ds_optim::dtype_code("multi_tensor_lion", checked.state_type), chunk_size,
        static_cast<int>(checked.sizes.size()), checked.table().data(), checked.sizes.data(),
        lr, beta1, beta2, weight_decay, c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == nullptr, "multi_tensor_lion: ", err == nullptr ? "" : err);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("multi_tensor_lion", &multi_tensor_lion,
          "Lion step over lists of (param, grad, exp_avg) CUDA tensors", py::arg("chunk_size"),
          py::arg("tensor_lists"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"),
          py::arg("weight_decay"));
}
