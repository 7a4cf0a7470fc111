// Python binding of the fused LAMB kernel: validates the tensor lists, allocates the fp32 update
// scratch and the per-tensor norm accumulators, and launches on torch's current CUDA stream.
// Params and grads share one dtype; the moments share the params' dtype or are float32.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <vector>

#include "tensor_lists.h"

namespace ds_optim {
int64_t fused_lamb_scratch_elements(int num_tensors, const int64_t* sizes);
const char* launch_fused_lamb(int dtype, int state_dtype, int64_t min_share, int num_tensors,
                              void* const* const* lists, const int64_t* sizes,
                              float* updates_base, float* norms_sq, float* coeffs, double lr,
                              double beta1, double beta2, double eps, bool eps_inside_sqrt,
                              int64_t step, bool bias_correction, double weight_decay,
                              double max_coeff, double min_coeff, double grad_scale,
                              cudaStream_t stream);
}

namespace {

// The fewest elements a block is given (a small update uses fewer blocks).
constexpr int64_t kMinShare = 16384;
}  // namespace

// Returns the fp32 tensor of per-tensor LAMB coefficients (1 for empty or zero-norm tensors).
at::Tensor lamb(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                const std::vector<at::Tensor>& exp_avgs,
                const std::vector<at::Tensor>& exp_avg_sqs, double lr, double beta1,
                double beta2, double eps, bool eps_inside_sqrt, int64_t step,
                bool bias_correction, double weight_decay, double max_coeff, double min_coeff,
                double grad_scale) {
    TORCH_CHECK(!params.empty(), "fused_lamb: params is empty");
    TORCH_CHECK(!exp_avgs.empty(), "fused_lamb: exp_avgs is empty");
    static const char* names[4] = {"params", "grads", "exp_avgs", "exp_avg_sqs"};
    const ds_optim::CheckedLists checked = ds_optim::check_tensor_lists(
        "fused_lamb", {&params, &grads, &exp_avgs, &exp_avg_sqs}, names);
    const at::Tensor& first = params[0];
    const size_t n = params.size();
    const std::vector<int64_t>& sizes = checked.sizes;
    const c10::cuda::CUDAGuard guard(first.device());
    const auto fp32 = first.options().dtype(at::kFloat);
    // torch's allocator returns blocks aligned far beyond the 32 bytes the kernel needs
    const int64_t scratch = ds_optim::fused_lamb_scratch_elements(static_cast<int>(n),
                                                                  sizes.data());
    at::Tensor updates = at::empty({scratch}, fp32);
    at::Tensor norms_sq = at::zeros({2 * static_cast<int64_t>(n)}, fp32);
    at::Tensor coeffs = at::ones({static_cast<int64_t>(n)}, fp32);
    const char* err = ds_optim::launch_fused_lamb(
        ds_optim::dtype_code("fused_lamb", first.scalar_type()),
        ds_optim::dtype_code("fused_lamb", checked.state_type), kMinShare, static_cast<int>(n),
        checked.table().data(), sizes.data(),
        updates.data_ptr<float>(), norms_sq.data_ptr<float>(), coeffs.data_ptr<float>(), lr,
        beta1, beta2, eps, eps_inside_sqrt, step, bias_correction, weight_decay, max_coeff,
        min_coeff, grad_scale, c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == nullptr, "fused_lamb: ", err == nullptr ? "" : err);
    return coeffs;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("lamb", &lamb, "LAMB step over lists of (param, grad, exp_avg, exp_avg_sq) CUDA "
          "tensors; returns the per-tensor trust ratios",
          py::arg("params"), py::arg("grads"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"),
          py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
          py::arg("eps_inside_sqrt"), py::arg("step"), py::arg("bias_correction"),
          py::arg("weight_decay"), py::arg("max_coeff"), py::arg("min_coeff"),
          py::arg("grad_scale"));
}
