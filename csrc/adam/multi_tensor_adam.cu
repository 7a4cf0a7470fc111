// Adam / AdamW over lists of (param, grad, exp_avg, exp_avg_sq) tensors of one dtype, computed in
// fp32 registers whatever the storage type:
//   L2 (mode 0):          g = g + wd*p                          (before the moments)
//   m = b1*m + (1-b1)*g   v = b2*v + (1-b2)*g^2
//   decoupled (mode 1):   p = p - lr*wd*p
//   p = p - lr/bias1 * m / (sqrt(v)/sqrt(bias2) + eps)
// The bias corrections are computed on the host in double (1 without bias correction).
#include "ds_cuda_compat.h"
#include "multi_tensor_apply.cuh"

namespace ds_optim {
namespace {

template <typename T>
struct AdamOp {
    float lr, beta1, beta2, eps, step_size, bias2_sqrt, weight_decay;
    int adamw_mode;

    // kIlp elements per thread per round, loaded into registers before any is computed, so
    // each thread keeps several independent loads in flight (one at a time left the H200's
    // memory system a third idle: 1.68 ms against torch's fused AdamW's 1.34 ms on 104M fp32);
    // element i + k * blockDim.x keeps every load and store coalesced across the warp
    static constexpr int kIlp = 4;

    __device__ void operator()(void* const* ptrs, int64_t offset, int64_t n, int) const {
        T* p = static_cast<T*>(ptrs[0]) + offset;
        const T* g = static_cast<const T*>(ptrs[1]) + offset;
        T* m = static_cast<T*>(ptrs[2]) + offset;
        T* v = static_cast<T*>(ptrs[3]) + offset;
        const int64_t stride = static_cast<int64_t>(blockDim.x);
        for (int64_t start = 0; start < n; start += stride * kIlp) {
            float pf[kIlp], gf[kIlp], mf[kIlp], vf[kIlp];
#pragma unroll
            for (int k = 0; k < kIlp; ++k) {
                const int64_t i = start + threadIdx.x + k * stride;
                const bool in = i < n;
                pf[k] = in ? to_float(p[i]) : 0.f;
                gf[k] = in ? to_float(g[i]) : 0.f;
                mf[k] = in ? to_float(m[i]) : 0.f;
                vf[k] = in ? to_float(v[i]) : 0.f;
            }
#pragma unroll
            for (int k = 0; k < kIlp; ++k) {
                if (!adamw_mode && weight_decay != 0.f) gf[k] += weight_decay * pf[k];
                mf[k] = beta1 * mf[k] + (1.f - beta1) * gf[k];
                vf[k] = beta2 * vf[k] + (1.f - beta2) * gf[k] * gf[k];
                const float denom = sqrtf(vf[k]) / bias2_sqrt + eps;
                if (adamw_mode && weight_decay != 0.f) pf[k] *= 1.f - lr * weight_decay;
                pf[k] -= step_size * mf[k] / denom;
            }
#pragma unroll
            for (int k = 0; k < kIlp; ++k) {
                const int64_t i = start + threadIdx.x + k * stride;
                if (i < n) {
                    p[i] = from_float<T>(pf[k]);
                    m[i] = from_float<T>(mf[k]);
                    v[i] = from_float<T>(vf[k]);
                }
            }
        }
    }
};

template <typename T>
const char* launch_typed(int64_t chunk_size, int num_tensors, void* const* const* lists,
                         const int64_t* sizes, const AdamOp<float>& hp, cudaStream_t stream) {
    AdamOp<T> op{hp.lr, hp.beta1, hp.beta2, hp.eps, hp.step_size, hp.bias2_sqrt,
                 hp.weight_decay, hp.adamw_mode};
    return multi_tensor_apply<4>(chunk_size, num_tensors, lists, sizes, stream, op);
}

}  // namespace

// lists: 4 arrays (params, grads, exp_avgs, exp_avg_sqs) of num_tensors device pointers.
// Returns nullptr on success, else an error message.
const char* launch_multi_tensor_adam(int dtype, int64_t chunk_size, int num_tensors,
                                     void* const* const* lists, const int64_t* sizes, double lr,
                                     double beta1, double beta2, double eps, int64_t step,
                                     bool adamw_mode, bool bias_correction, double weight_decay,
                                     cudaStream_t stream) {
    if (chunk_size <= 0) return "multi_tensor_adam: chunk_size must be positive";
    if (step <= 0) return "multi_tensor_adam: step must be >= 1";
    double bias1 = 1.0, bias2 = 1.0;
    if (bias_correction) {
        bias1 = 1.0 - pow(beta1, static_cast<double>(step));
        bias2 = 1.0 - pow(beta2, static_cast<double>(step));
    }
    AdamOp<float> hp{static_cast<float>(lr), static_cast<float>(beta1),
                     static_cast<float>(beta2), static_cast<float>(eps),
                     static_cast<float>(lr / bias1), static_cast<float>(sqrt(bias2)),
                     static_cast<float>(weight_decay), adamw_mode ? 1 : 0};
    switch (static_cast<DType>(dtype)) {
        case DType::kFloat32:
            return launch_typed<float>(chunk_size, num_tensors, lists, sizes, hp, stream);
        case DType::kFloat16:
            return launch_typed<__half>(chunk_size, num_tensors, lists, sizes, hp, stream);
        case DType::kBFloat16:
            return launch_typed<__nv_bfloat16>(chunk_size, num_tensors, lists, sizes, hp, stream);
    }
    return "multi_tensor_adam: unsupported dtype code (allowed: float32, float16, bfloat16)";
}

}  // namespace ds_optim
