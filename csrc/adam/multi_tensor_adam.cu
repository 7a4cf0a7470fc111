// Adam / AdamW over lists of (param, grad, exp_avg, exp_avg_sq) tensors, computed in fp32
// registers whatever the storage type:
//   L2 (mode 0):          g = g + wd*p                          (before the moments)
//   m = b1*m + (1-b1)*g   v = b2*v + (1-b2)*g^2
//   decoupled (mode 1):   p = p - lr*wd*p
//   p = p - lr/bias1 * m / (sqrt(v)/sqrt(bias2) + eps)
// The scalars are computed on the host in double and rounded once: 1 - beta in fp32 registers
// would be off by up to 1.3e-5 relative (1 - float(0.999)), which moved the update of ~2% of
// fp32 params by more than 2 ulps from torch's (measured on an H200); lr*wd and lr/bias1 are
// rounded as torch's fused AdamW rounds them (1 without bias correction).
// Params and grads share one type T (fp32, fp16 or bf16); the moments are T too, or fp32 for
// 16-bit params (fp32 state keeps small updates that a 16-bit moment would round away).
#include "ds_cuda_compat.h"
#include "multi_tensor_apply.cuh"

namespace ds_optim {

struct AdamHyper {
    float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, step_size, bias2_sqrt,
        weight_decay, lr_weight_decay;
    int adamw_mode;

    // One element's update, in the order of operations the PyTorch path and torch's fused
    // AdamW use (tests compare to them within fp32 rounding).
    DS_HD void update(float& p, float g, float& m, float& v) const {
        if (!adamw_mode && weight_decay != 0.f) g += weight_decay * p;
        m = beta1 * m + one_minus_beta1 * g;
        v = beta2 * v + one_minus_beta2 * g * g;
        const float denom = sqrtf(v) / bias2_sqrt + eps;
        if (adamw_mode && weight_decay != 0.f) p = fmaf(-lr_weight_decay, p, p);
        p -= step_size * m / denom;
    }
};

template <typename T, typename S>
struct AdamOp {
    AdamHyper hp;

    // Elements per thread per round: 8, i.e. one 16-byte word of each 16-bit list and two of
    // each fp32 one, so that fp32 lists keep as many bytes in flight per thread (latency-bound
    // at 1024 resident threads per SM, 64 registers each) as 16-bit params with fp32 moments,
    // which ran at 2.7-2.9 TB/s on an H200 when the op was fed ready lists. (The fp32 step at 4
    // elements measured 0.97x torch's fused AdamW, at 8 0.93x on another H200, both through
    // FusedAdam.step whose host bookkeeping then dominated: the kernel's own fp32 speed at
    // either width is not separated yet.) 16 elements of 16-bit lists would need 64 floats of
    // registers and spill.
    static constexpr int kVec = 8;

    DS_HD void operator()(void* const* ptrs, int64_t offset, int64_t n, int) const {
        T* p = static_cast<T*>(ptrs[0]) + offset;
        const T* g = static_cast<const T*>(ptrs[1]) + offset;
        S* m = static_cast<S*>(ptrs[2]) + offset;
        S* v = static_cast<S*>(ptrs[3]) + offset;
        const void* const arrays[4] = {p, g, m, v};
        const int bytes[4] = {sizeof(T), sizeof(T), sizeof(S), sizeof(S)};
        for_each_run<kVec>(arrays, bytes, n, [&](auto width, int64_t i) {
            constexpr int N = decltype(width)::value;
            float pf[N], gf[N], mf[N], vf[N];
            load_vec(p + i, pf);
            load_vec(g + i, gf);
            load_vec(m + i, mf);
            load_vec(v + i, vf);
#pragma unroll
            for (int k = 0; k < N; ++k) hp.update(pf[k], gf[k], mf[k], vf[k]);
            store_vec(p + i, pf);
            store_vec(m + i, mf);
            store_vec(v + i, vf);
        });
    }
};

template <typename T, typename S>
const char* launch_adam(int64_t min_share, int num_tensors, void* const* const* lists,
                         const int64_t* sizes, const AdamHyper& hp, cudaStream_t stream) {
    return multi_tensor_apply<4>(min_share, num_tensors, lists, sizes, stream, AdamOp<T, S>{hp});
}

template <typename T>
const char* launch_adam_state(int state_dtype, int64_t min_share, int num_tensors,
                         void* const* const* lists, const int64_t* sizes, const AdamHyper& hp,
                         cudaStream_t stream) {
    if (state_dtype == static_cast<int>(DType::kFloat32))
        return launch_adam<T, float>(min_share, num_tensors, lists, sizes, hp, stream);
    return launch_adam<T, T>(min_share, num_tensors, lists, sizes, hp, stream);
}

// The kernel's fp32 hyper-parameters; the bias corrections are computed in double.
AdamHyper adam_hyper(double lr, double beta1, double beta2, double eps, int64_t step,
                     bool adamw_mode, bool bias_correction, double weight_decay) {
    double bias1 = 1.0, bias2 = 1.0;
    if (bias_correction) {
        bias1 = 1.0 - pow(beta1, static_cast<double>(step));
        bias2 = 1.0 - pow(beta2, static_cast<double>(step));
    }
    // torch rounds the bias correction to fp32 before dividing lr by it
    const double step_size = lr / static_cast<double>(static_cast<float>(bias1));
    return AdamHyper{static_cast<float>(beta1), static_cast<float>(beta2),
                     static_cast<float>(1.0 - beta1), static_cast<float>(1.0 - beta2),
                     static_cast<float>(eps), static_cast<float>(step_size),
                     static_cast<float>(sqrt(bias2)), static_cast<float>(weight_decay),
                     static_cast<float>(lr * weight_decay), adamw_mode ? 1 : 0};
}

// lists: 4 arrays (params, grads, exp_avgs, exp_avg_sqs) of num_tensors device pointers; the
// moments are of `state_dtype`: the params' dtype, or float32. min_share: the fewest elements
// a block is given. Returns nullptr on success, else an error message.
const char* launch_multi_tensor_adam(int dtype, int state_dtype, int64_t min_share,
                                     int num_tensors, void* const* const* lists,
                                     const int64_t* sizes, double lr, double beta1, double beta2,
                                     double eps, int64_t step, bool adamw_mode,
                                     bool bias_correction, double weight_decay,
                                     cudaStream_t stream) {
    if (min_share <= 0) return "multi_tensor_adam: chunk_size must be positive";
    if (step <= 0) return "multi_tensor_adam: step must be >= 1";
    if (state_dtype != dtype && state_dtype != static_cast<int>(DType::kFloat32))
        return "multi_tensor_adam: the moments must have the params' dtype or float32";
    const AdamHyper hp =
        adam_hyper(lr, beta1, beta2, eps, step, adamw_mode, bias_correction, weight_decay);
    switch (static_cast<DType>(dtype)) {
        case DType::kFloat32:
            return launch_adam<float, float>(min_share, num_tensors, lists, sizes, hp, stream);
        case DType::kFloat16:
            return launch_adam_state<__half>(state_dtype, min_share, num_tensors, lists, sizes,
                                             hp, stream);
        case DType::kBFloat16:
            return launch_adam_state<__nv_bfloat16>(state_dtype, min_share, num_tensors, lists,
                                                    sizes, hp, stream);
    }
    return "multi_tensor_adam: unsupported dtype code (allowed: float32, float16, bfloat16)";
}

}  // namespace ds_optim
