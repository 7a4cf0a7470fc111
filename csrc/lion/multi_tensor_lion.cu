// Lion (arXiv 2302.06675) over lists of (param, grad, exp_avg) tensors, computed in fp32
// registers whatever the storage type, in the order of operations of the PyTorch path
// (deepspeed/ops/lion/functional.py; torch.lerp is start + w * (end - start)):
//   c = sign(m + (1-b1) * (g - m))
//   p = p * (1 - lr*wd)          (decoupled weight decay, when wd != 0)
//   p = p - lr * c
//   m = m + (1-b2) * (g - m)
// Params and grads share one type T (fp32, fp16 or bf16); exp_avg is T too, or fp32.
#include "ds_cuda_compat.h"
#include "multi_tensor_apply.cuh"

namespace ds_optim {

struct LionHyper {
    // 1 - beta and 1 - lr*wd come rounded from double: in fp32 registers 1 - float(0.99) is
    // off by ~1e-6 relative
    float lr, one_minus_beta1, one_minus_beta2, decay, weight_decay;

    DS_HD void update(float& p, float g, float& m) const {
        const float blend = m + one_minus_beta1 * (g - m);
        const float c = blend > 0.f ? 1.f : (blend < 0.f ? -1.f : 0.f);
        if (weight_decay != 0.f) p *= decay;
        p -= lr * c;
        m = m + one_minus_beta2 * (g - m);
    }
};

template <typename T, typename S>
struct LionOp {
    LionHyper hp;
    static constexpr int kVec = 16 / (sizeof(T) < sizeof(S) ? sizeof(T) : sizeof(S));

    DS_HD void operator()(void* const* ptrs, int64_t offset, int64_t n, int) const {
        T* p = static_cast<T*>(ptrs[0]) + offset;
        const T* g = static_cast<const T*>(ptrs[1]) + offset;
        S* m = static_cast<S*>(ptrs[2]) + offset;
        const void* const arrays[3] = {p, g, m};
        const int bytes[3] = {sizeof(T), sizeof(T), sizeof(S)};
        for_each_run<kVec>(arrays, bytes, n, [&](auto width, int64_t i) {
            constexpr int N = decltype(width)::value;
            float pf[N], gf[N], mf[N];
            load_vec(p + i, pf);
            load_vec(g + i, gf);
            load_vec(m + i, mf);
#pragma unroll
            for (int k = 0; k < N; ++k) hp.update(pf[k], gf[k], mf[k]);
            store_vec(p + i, pf);
            store_vec(m + i, mf);
        });
    }
};

template <typename T, typename S>
const char* launch_lion(int64_t min_share, int num_tensors, void* const* const* lists,
                        const int64_t* sizes, const LionHyper& hp, cudaStream_t stream) {
    return multi_tensor_apply<3>(min_share, num_tensors, lists, sizes, stream, LionOp<T, S>{hp});
}

template <typename T>
const char* launch_lion_state(int state_dtype, int64_t min_share, int num_tensors,
                              void* const* const* lists, const int64_t* sizes,
                              const LionHyper& hp, cudaStream_t stream) {
    if (state_dtype == static_cast<int>(DType::kFloat32))
        return launch_lion<T, float>(min_share, num_tensors, lists, sizes, hp, stream);
    return launch_lion<T, T>(min_share, num_tensors, lists, sizes, hp, stream);
}

// lists: 3 arrays (params, grads, exp_avgs) of num_tensors device pointers. Returns nullptr on
// success, else an error message.
const char* launch_multi_tensor_lion(int dtype, int state_dtype, int64_t min_share,
                                     int num_tensors, void* const* const* lists,
                                     const int64_t* sizes, double lr, double beta1, double beta2,
                                     double weight_decay, cudaStream_t stream) {
    if (min_share <= 0) return "multi_tensor_lion: chunk_size must be positive";
    if (state_dtype != dtype && state_dtype != static_cast<int>(DType::kFloat32))
        return "multi_tensor_lion: exp_avg must have the params' dtype or float32";
    const LionHyper hp{static_cast<float>(lr), static_cast<float>(1.0 - beta1),
                       static_cast<float>(1.0 - beta2),
                       static_cast<float>(1.0 - lr * weight_decay),
                       static_cast<float>(weight_decay)};
    switch (static_cast<DType>(dtype)) {
        case DType::kFloat32:
            return launch_lion<float, float>(min_share, num_tensors, lists, sizes, hp, stream);
        case DType::kFloat16:
            return launch_lion_state<__half>(state_dtype, min_share, num_tensors, lists, sizes,
                                             hp, stream);
        case DType::kBFloat16:
            return launch_lion_state<__nv_bfloat16>(state_dtype, min_share, num_tensors, lists,
                                                    sizes, hp, stream);
    }
    return "multi_tensor_lion: unsupported dtype code (allowed: float32, float16, bfloat16)";
}

}  // namespace ds_optim
