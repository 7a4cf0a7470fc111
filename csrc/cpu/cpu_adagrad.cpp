// Adagrad step on contiguous fp32 buffers (see deepspeed.ops.adagrad.cpu_adagrad):
//   g = g + wd*p  (wd > 0) ;  s = s + g*g ;  p = p - lr * g / (sqrt(s) + eps)
#include "optim_common.h"  // first: it includes <Python.h>

#include <cmath>

namespace ds_cpu {

template <bool WD, int Half>
static void adagrad_kernel(float* __restrict p, const float* __restrict g, float* __restrict s,
                           uint16_t* __restrict half, int64_t n, float lr, float eps,
                           float weight_decay) {
    parallel_chunks(n, [&](int64_t begin, int64_t end) {
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) {
            float grad = g[i];
            float param = p[i];
            if constexpr (WD) grad = grad + weight_decay * param;
            const float si = s[i] + grad * grad;
            param = param - lr * grad / (std::sqrt(si) + eps);
            s[i] = si;
            p[i] = param;
            store_half<Half>(half, i, param);
        }
    });
}

template <bool WD>
static void adagrad_dispatch_half(int half_kind, float* p, const float* g, float* s,
                                  uint16_t* h, int64_t n, float lr, float eps, float wd) {
    switch (half_kind) {
        case kBF16: adagrad_kernel<WD, kBF16>(p, g, s, h, n, lr, eps, wd); break;
        case kFP16: adagrad_kernel<WD, kFP16>(p, g, s, h, n, lr, eps, wd); break;
        default:    adagrad_kernel<WD, kNone>(p, g, s, h, n, lr, eps, wd); break;
    }
}

void adagrad_update(std::uintptr_t param, std::uintptr_t grad, std::uintptr_t state_sum,
                    std::uintptr_t half_out, int half_kind, int64_t n, double lr, double eps,
                    double weight_decay) {
    check_half_kind(half_kind);
    if (n < 0) throw std::invalid_argument("adagrad_update: n must be >= 0");
    auto* p = as_ptr<float>(param);
    auto* g = as_ptr<const float>(grad);
    auto* s = as_ptr<float>(state_sum);
    auto* h = as_ptr<uint16_t>(half_out);
    if (weight_decay != 0.0) {
        adagrad_dispatch_half<true>(half_kind, p, g, s, h, n, float(lr), float(eps),
                                    float(weight_decay));
    } else {
        adagrad_dispatch_half<false>(half_kind, p, g, s, h, n, float(lr), float(eps), 0.0f);
    }
}

}  // namespace ds_cpu

static PyObject* py_adagrad_update(PyObject*, PyObject* args, PyObject* kwargs) {
    static const char* names[] = {"param", "grad", "state_sum", "half_out", "half_kind", "n", "lr",
                                  "eps", "weight_decay", nullptr};
    unsigned long long param, grad, state_sum, half_out;
    int half_kind;
    long long n;
    double lr, eps, weight_decay;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKKKiLddd:adagrad_update",
                                     const_cast<char**>(names),
                                     &param, &grad, &state_sum, &half_out, &half_kind, &n, &lr,
                                     &eps, &weight_decay)) {
        return nullptr;
    }
    return ds_cpu::run_without_gil([&] {
        ds_cpu::adagrad_update(std::uintptr_t(param), std::uintptr_t(grad),
                               std::uintptr_t(state_sum), std::uintptr_t(half_out), half_kind,
                               int64_t(n), lr, eps, weight_decay);
    });
}

static PyMethodDef methods[] = {
    DS_CPU_KEYWORDS_FN("adagrad_update", py_adagrad_update,
                       "One Adagrad step over n fp32 elements, in place"),
    DS_CPU_SIMD_LEVEL_FN,
    {nullptr, nullptr, 0, nullptr},
};

DS_CPU_MODULE("DeepSpeed CPU Adagrad kernel on contiguous fp32 buffers (raw pointers)", methods)
