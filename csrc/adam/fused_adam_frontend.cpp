// Python binding of the multi-tensor Adam kernel: validates the tensor lists (the kernel trusts
// raw pointers), gathers pointers and sizes, and launches on torch's current CUDA stream.
// Params and grads share one dtype; the moments share the params' dtype or are float32.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <vector>

#include "tensor_lists.h"

namespace ds_optim {
const char* launch_multi_tensor_adam(int dtype, int state_dtype, int64_t min_share,
                                     int num_tensors, void* const* const* lists,
                                     const int64_t* sizes, double lr, double beta1, double beta2,
                                     double eps, int64_t step, bool adamw_mode,
                                     bool bias_correction, double weight_decay,
                                     cudaStream_t stream);
}

// chunk_size: the fewest elements a block of the kernel takes (a small update uses fewer blocks)
void multi_tensor_adam(int64_t chunk_size, const std::vector<std::vector<at::Tensor>>& lists,
                       double lr, double beta1, double beta2, double eps, int64_t step,
                       int64_t mode, bool bias_correction, double weight_decay) {
    TORCH_CHECK(lists.size() == 4, "multi_tensor_adam: expected 4 tensor lists ",
                "(params, grads, exp_avgs, exp_avg_sqs), got ", lists.size());
    TORCH_CHECK(mode == 0 || mode == 1, "multi_tensor_adam: mode must be 0 (L2) or 1 (AdamW), "
                "got ", mode);
    if (lists[0].empty()) return;
    static const char* names[4] = {"params", "grads", "exp_avgs", "exp_avg_sqs"};
    const ds_optim::CheckedLists checked = ds_optim::check_tensor_lists(
        "multi_tensor_adam", {&lists[0], &lists[1], &lists[2], &lists[3]}, names);
    const at::Tensor& first = lists[0][0];
    const c10::cuda::CUDAGuard guard(first.device());
    const char* err = ds_optim::launch_multi_tensor_adam(
        ds_optim::dtype_code("multi_tensor_adam", first.scalar_type()),
        ds_optim::dtype_code("multi_tensor_adam", checked.state_type), chunk_size,
        static_cast<int>(checked.sizes.size()), checked.table().data(), checked.sizes.data(),
        lr, beta1, beta2, eps, step, mode == 1, bias_correction, weight_decay,
        c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == nullptr, "multi_tensor_adam: ", err == nullptr ? "" : err);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("multi_tensor_adam", &multi_tensor_adam,
          "Adam/AdamW step over lists of (param, grad, exp_avg, exp_avg_sq) CUDA tensors",
          py::arg("chunk_size"), py::arg("tensor_lists"), py::arg("lr"), py::arg("beta1"),
          py::arg("beta2"), py::arg("eps"), py::arg("step"), py::arg("mode"),
          py::arg("bias_correction"), py::arg("weight_decay"));
}
