// Python binding of the multi-tensor Lion kernel: validates the tensor lists (the kernel trusts
// raw pointers), gathers pointers and sizes, and launches on torch's current CUDA stream.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <vector>

namespace ds_optim {
const char* launch_multi_tensor_lion(int dtype, int state_dtype, int64_t min_share,
                                     int num_tensors, void* const* const* lists,
                                     const int64_t* sizes, double lr, double beta1, double beta2,
                                     double weight_decay, cudaStream_t stream);
}

namespace {

int dtype_code(const at::ScalarType t) {
    switch (t) {
        case at::kFloat: return 0;
        case at::kHalf: return 1;
        case at::kBFloat16: return 2;
        default:
            TORCH_CHECK(false, "multi_tensor_lion: unsupported dtype ", t,
                        " (allowed: float32, float16, bfloat16)");
    }
    return -1;
}

const char* kListNames[3] = {"params", "grads", "exp_avgs"};

}  // namespace

void multi_tensor_lion(int64_t chunk_size, const std::vector<std::vector<at::Tensor>>& lists,
                       double lr, double beta1, double beta2, double weight_decay) {
    TORCH_CHECK(lists.size() == 3, "multi_tensor_lion: expected 3 tensor lists ",
                "(params, grads, exp_avgs), got ", lists.size());
    const size_t n = lists[0].size();
    if (n == 0) return;
    const at::Tensor& first = lists[0][0];
    const at::ScalarType state_type = lists[2][0].scalar_type();
    TORCH_CHECK(state_type == first.scalar_type() || state_type == at::kFloat,
                "multi_tensor_lion: exp_avgs[0] has dtype ", state_type, "; it must have the ",
                "params' dtype (", first.scalar_type(), ") or float32");
    std::vector<void*> ptrs[3];
    std::vector<int64_t> sizes(n);
    for (int d = 0; d < 3; ++d) {
        TORCH_CHECK(lists[d].size() == n, "multi_tensor_lion: ", kListNames[d], " has ",
                    lists[d].size(), " tensors, params has ", n);
        ptrs[d].resize(n);
        for (size_t i = 0; i < n; ++i) {
            const at::Tensor& t = lists[d][i];
            TORCH_CHECK(t.is_cuda() && t.device() == first.device(), "multi_tensor_lion: ",
                        kListNames[d], "[", i, "] is on ", t.device(), ", expected ",
                        first.device());
            const at::ScalarType expected = d < 2 ? first.scalar_type() : state_type;
            TORCH_CHECK(t.scalar_type() == expected, "multi_tensor_lion: ", kListNames[d], "[",
                        i, "] has dtype ", t.scalar_type(), ", expected ", expected);
            TORCH_CHECK(t.is_contiguous(), "multi_tensor_lion: ", kListNames[d], "[", i,
                        "] is not contiguous");
            TORCH_CHECK(t.numel() == lists[0][i].numel(), "multi_tensor_lion: ", kListNames[d],
                        "[", i, "] has ", t.numel(), " elements, params[", i, "] has ",
                        lists[0][i].numel());
            ptrs[d][i] = t.data_ptr();
        }
    }
    for (size_t i = 0; i < n; ++i) sizes[i] = lists[0][i].numel();
    void* const* table[3] = {ptrs[0].data(), ptrs[1].data(), ptrs[2].data()};
    const c10::cuda::CUDAGuard guard(first.device());
    const char* err = ds_optim::launch_multi_tensor_lion(
        dtype_code(first.scalar_type()), dtype_code(state_type), chunk_size,
        static_cast<int>(n), table, sizes.data(), lr, beta1, beta2, weight_decay,
        c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err == nullptr, "multi_tensor_lion: ", err == nullptr ? "" : err);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("multi_tensor_lion", &multi_tensor_lion,
          "Lion step over lists of (param, grad, exp_avg) CUDA tensors", py::arg("chunk_size"),
          py::arg("tensor_lists"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"),
          py::arg("weight_decay"));
}
