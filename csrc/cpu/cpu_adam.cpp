// Adam / AdamW step on contiguous fp32 buffers (see deepspeed.ops.adam.functional for the math):
//   L2 (adamw_mode=false, wd > 0):  g = g + wd*p
//   m = b1*m + (1-b1)*g ;  v = b2*v + (1-b2)*g*g
//   decoupled (adamw_mode=true):    p = p * (1 - lr*wd)
//   p = p - lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)     (eps outside the sqrt)
// with both corrections 1 when bias_correction is false.
#include "optim_common.h"  // first: it includes <Python.h>

#include <cmath>

namespace ds_cpu {

template <bool L2, int Half>
static void adam_kernel(float* __restrict p, const float* __restrict g, float* __restrict m,
                        float* __restrict v, uint16_t* __restrict half, int64_t n, float step_size,
                        float beta1, float beta2, float one_minus_b1, float one_minus_b2,
                        float eps, float weight_decay, float decay, float inv_sqrt_bc2) {
    parallel_chunks(n, [&](int64_t begin, int64_t end) {
#pragma omp simd
        for (int64_t i = begin; i < end; ++i) {
            float grad = g[i];
            float param = p[i];
            if constexpr (L2) grad = grad + weight_decay * param;
            const float mi = beta1 * m[i] + one_minus_b1 * grad;
            const float vi = beta2 * v[i] + one_minus_b2 * grad * grad;
            const float denom = std::sqrt(vi) * inv_sqrt_bc2 + eps;
            param = param * decay - step_size * mi / denom;
            m[i] = mi;
            v[i] = vi;
            p[i] = param;
            store_half<Half>(half, i, param);
        }
    });
}

template <bool L2>
static void adam_dispatch_half(int half_kind, float* p, const float* g, float* m, float* v,
                               uint16_t* half, int64_t n, float step_size, float b1, float b2,
                               float omb1, float omb2, float eps, float wd, float decay,
                               float inv_sqrt_bc2) {
    switch (half_kind) {
        case kBF16:
            adam_kernel<L2, kBF16>(p, g, m, v, half, n, step_size, b1, b2, omb1, omb2, eps, wd,
                                   decay, inv_sqrt_bc2);
            break;
        case kFP16:
            adam_kernel<L2, kFP16>(p, g, m, v, half, n, step_size, b1, b2, omb1, omb2, eps, wd,
                                   decay, inv_sqrt_bc2);
            break;
        default:
            adam_kernel<L2, kNone>(p, g, m, v, half, n, step_size, b1, b2, omb1, omb2, eps, wd,
                                   decay, inv_sqrt_bc2);
    }
}

void adam_update(std::uintptr_t param, std::uintptr_t grad, std::uintptr_t exp_avg,
                 std::uintptr_t exp_avg_sq, std::uintptr_t half_out, int half_kind, int64_t n,
                 double lr, double beta1, double beta2, double eps, double weight_decay,
                 int64_t step, bool bias_correction, bool adamw_mode) {
    check_half_kind(half_kind);
    if (n < 0) throw std::invalid_argument("adam_update: n must be >= 0");
    if (step < 1) throw std::invalid_argument("adam_update: step must be >= 1");
    // 1-beta and the corrections in double, as the PyTorch path computes them in Python floats:
    // 1.0f - float(0.999) is off by 1.3e-5 relative
    const double bc1 = bias_correction ? 1.0 - std::pow(beta1, double(step)) : 1.0;
    const double bc2 = bias_correction ? 1.0 - std::pow(beta2, double(step)) : 1.0;
    const float step_size = float(lr / bc1);
    const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
    const bool l2 = !adamw_mode && weight_decay != 0.0;
    const float decay =
        (adamw_mode && weight_decay != 0.0) ? float(1.0 - lr * weight_decay) : 1.0f;
    auto* p = as_ptr<float>(param);
    auto* g = as_ptr<const float>(grad);
    auto* m = as_ptr<float>(exp_avg);
    auto* v = as_ptr<float>(exp_avg_sq);
    auto* h = as_ptr<uint16_t>(half_out);
    if (l2) {
        adam_dispatch_half<true>(half_kind, p, g, m, v, h, n, step_size, float(beta1), float(beta2),
                                 float(1.0 - beta1), float(1.0 - beta2),
                                 float(eps), float(weight_decay), decay, inv_sqrt_bc2);
    } else {
        adam_dispatch_half<false>(half_kind, p, g, m, v, h, n, step_size, float(beta1),
                                  float(beta2),
                                  float(1.0 - beta1), float(1.0 - beta2),
                                  float(eps), float(weight_decay), decay, inv_sqrt_bc2);
    }
}

}  // namespace ds_cpu

static PyObject* py_adam_update(PyObject*, PyObject* args, PyObject* kwargs) {
    static const char* names[] = {"param", "grad", "exp_avg", "exp_avg_sq", "half_out", "half_kind",
                                  "n", "lr", "beta1", "beta2", "eps", "weight_decay", "step",
                                  "bias_correction", "adamw_mode", nullptr};
    unsigned long long param, grad, exp_avg, exp_avg_sq, half_out;
    int half_kind, bias_correction, adamw_mode;
    long long n, step;
    double lr, beta1, beta2, eps, weight_decay;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKKKKiLdddddLpp:adam_update",
                                     const_cast<char**>(names),
                                     &param, &grad, &exp_avg, &exp_avg_sq, &half_out, &half_kind,
                                     &n, &lr, &beta1, &beta2, &eps, &weight_decay, &step,
                                     &bias_correction, &adamw_mode)) {
        return nullptr;
    }
    return ds_cpu::run_without_gil([&] {
        ds_cpu::adam_update(std::uintptr_t(param), std::uintptr_t(grad), std::uintptr_t(exp_avg),
                            std::uintptr_t(exp_avg_sq), std::uintptr_t(half_out), half_kind,
                            int64_t(n), lr, beta1, beta2, eps, weight_decay, int64_t(step),
                            bias_correction != 0, adamw_mode != 0);
    });
}

static PyMethodDef methods[] = {
    DS_CPU_KEYWORDS_FN("adam_update", py_adam_update,
                       "One Adam/AdamW step over n fp32 elements, in place"),
    DS_CPU_SIMD_LEVEL_FN,
    {nullptr, nullptr, 0, nullptr},
};

DS_CPU_MODULE("DeepSpeed CPU Adam/AdamW kernel on contiguous fp32 buffers (raw pointers)", methods)
