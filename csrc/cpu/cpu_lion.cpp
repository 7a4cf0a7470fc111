// Lion step on contiguous fp32 buffers (see deepspeed.ops.lion.functional):
//   c = sign(b1*m + (1-b1)*g) ;  p = p*(1 - lr*wd) - lr*c ;  m = b2*m + (1-b2)*g
#include "optim_common.h"

namespace ds_cpu {

template <int Half>
static void lion_kernel(float* __restrict p, const float* __restrict g, float* __restrict m,
                        uint16_t* __restrict half, int64_t n, float lr, float beta1, float beta2,
                        float one_minus_b1, float one_minus_b2, float decay) {
    parallel_chunks(n, [&](int64_t begin, int64_t end) {
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) {
            const float grad = g[i];
            const float mi = m[i];
            const float c = beta1 * mi + one_minus_b1 * grad;
            const float sign = float(c > 0.0f) - float(c < 0.0f);
            const float param = p[i] * decay - lr * sign;
            m[i] = beta2 * mi + one_minus_b2 * grad;
            p[i] = param;
            store_half<Half>(half, i, param);
        }
    });
}

void lion_update(std::uintptr_t param, std::uintptr_t grad, std::uintptr_t exp_avg,
                 std::uintptr_t half_out, int half_kind, int64_t n, double lr, double beta1,
                 double beta2, double weight_decay) {
    check_half_kind(half_kind);
    if (n < 0) throw pybind11::value_error("lion_update: n must be >= 0");
    auto* p = as_ptr<float>(param);
    auto* g = as_ptr<const float>(grad);
    auto* m = as_ptr<float>(exp_avg);
    auto* h = as_ptr<uint16_t>(half_out);
    const float decay = weight_decay != 0.0 ? float(1.0 - lr * weight_decay) : 1.0f;
    // 1-beta in double (1.0f - float(0.99) would be off by ~1e-6 relative)
    const float omb1 = float(1.0 - beta1);
    const float omb2 = float(1.0 - beta2);
    switch (half_kind) {
        case kBF16:
            lion_kernel<kBF16>(p, g, m, h, n, float(lr), float(beta1), float(beta2), omb1, omb2,
                               decay);
            break;
        case kFP16:
            lion_kernel<kFP16>(p, g, m, h, n, float(lr), float(beta1), float(beta2), omb1, omb2,
                               decay);
            break;
        default:
            lion_kernel<kNone>(p, g, m, h, n, float(lr), float(beta1), float(beta2), omb1, omb2,
                               decay);
    }
}

}  // namespace ds_cpu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
    namespace py = pybind11;
    module.doc() = "DeepSpeed CPU Lion kernel on contiguous fp32 buffers (raw pointers)";
    module.def("lion_update", &ds_cpu::lion_update, py::call_guard<py::gil_scoped_release>(),
               py::arg("param"), py::arg("grad"), py::arg("exp_avg"), py::arg("half_out"),
               py::arg("half_kind"), py::arg("n"), py::arg("lr"), py::arg("beta1"),
               py::arg("beta2"), py::arg("weight_decay"));
    module.def("simd_level", &ds_cpu::simd_level);
}
