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
    if (n < 0) throw std::invalid_argument("lion_update: n must be >= 0");
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

static PyObject* py_lion_update(PyObject*, PyObject* args, PyObject* kwargs) {
    static const char* names[] = {"param", "grad", "exp_avg", "half_out", "half_kind", "n", "lr",
                                  "beta1", "beta2", "weight_decay", nullptr};
    unsigned long long param, grad, exp_avg, half_out;
    int half_kind;
    long long n;
    double lr, beta1, beta2, weight_decay;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKKKiLdddd:lion_update",
                                     const_cast<char**>(names),
                                     &param, &grad, &exp_avg, &half_out, &half_kind, &n, &lr,
                                     &beta1, &beta2, &weight_decay)) {
        return nullptr;
    }
    return ds_cpu::run_without_gil([&] {
        ds_cpu::lion_update(std::uintptr_t(param), std::uintptr_t(grad), std::uintptr_t(exp_avg),
                            std::uintptr_t(half_out), half_kind, int64_t(n), lr, beta1, beta2,
                            weight_decay);
    });
}

static PyMethodDef methods[] = {
    DS_CPU_KEYWORDS_FN("lion_update", py_lion_update,
                       "One Lion step over n fp32 elements, in place"),
    DS_CPU_SIMD_LEVEL_FN,
    {nullptr, nullptr, 0, nullptr},
};

DS_CPU_MODULE("DeepSpeed CPU Lion kernel on contiguous fp32 buffers (raw pointers)", methods)
