// DeepSpeed's LAMB over lists of (param, grad, exp_avg, exp_avg_sq) tensors, fp32 arithmetic.
// Two multi-tensor passes, because the trust ratio of a tensor needs the norms of the whole
// tensor before any of its elements may move:
//   pass 1: g = g/grad_scale; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2 (no bias correction)
//           denom = sqrt(v + eps) if eps_inside_sqrt else sqrt(v) + eps
//           u = m/denom + wd*p   (written to an fp32 scratch buffer)
//           sum p^2 and u^2 per tensor (block reduction, one atomicAdd per block and tensor)
//   pass 2: coeff = clamp(|p|/|u|, min_coeff, max_coeff), or 1 when either norm is 0
//           p = p - step_size*coeff*u, coeff recorded per tensor
// Params and grads share one type T; the moments are T or fp32 (S). Both passes use 16-byte
// loads and stores where the arrays are aligned (multi_tensor_apply.cuh, ds_cuda_compat.h).
#include "../adam/ds_cuda_compat.h"
#include "../adam/multi_tensor_apply.cuh"

#include <vector>

namespace ds_optim {

// Each tensor's scratch update starts a multiple of this many fp32 elements (32 bytes) into
// the buffer, so an aligned tensor's update is aligned too.
constexpr int64_t kScratchAlign = 8;

// Sum of `value` over the block, meaningful in thread 0 (needs kThreadsPerBlock threads).
__device__ float block_sum(float value, float* shared) {
    for (int offset = 16; offset > 0; offset >>= 1)
        value += __shfl_down_sync(0xffffffffu, value, offset);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // `shared` may still be read by a previous call
    if (lane == 0) shared[warp] = value;
    __syncthreads();
    float total = 0.f;
    if (threadIdx.x == 0)
        for (int w = 0; w < (blockDim.x + 31) / 32; ++w) total += shared[w];
    return total;  // meaningful in thread 0 only
}

template <typename T, typename S>
struct LambMomentsOp {
    // 1 - beta comes rounded from double (1.f - float(0.999) is off by 1.3e-5 relative)
    float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, inv_grad_scale;
    int eps_inside_sqrt;
    float* norms_sq;  // [2 * num_tensors]: param sums of squares, then update sums of squares
    int num_tensors;

    static constexpr int kVec = 16 / (sizeof(T) < sizeof(S) ? sizeof(T) : sizeof(S));

    DS_HD void operator()(void* const* ptrs, int64_t offset, int64_t n, int id) const {
        const T* p = static_cast<const T*>(ptrs[0]) + offset;
        const T* g = static_cast<const T*>(ptrs[1]) + offset;
        S* m = static_cast<S*>(ptrs[2]) + offset;
        S* v = static_cast<S*>(ptrs[3]) + offset;
        float* u = static_cast<float*>(ptrs[4]) + offset;
        float p_sq = 0.f, u_sq = 0.f;
        const void* const arrays[5] = {p, g, m, v, u};
        const int bytes[5] = {sizeof(T), sizeof(T), sizeof(S), sizeof(S), sizeof(float)};
        for_each_run<kVec>(arrays, bytes, n, [&](auto width, int64_t i) {
            constexpr int N = decltype(width)::value;
            float pf[N], gf[N], mf[N], vf[N], uf[N];
            load_vec(p + i, pf);
            load_vec(g + i, gf);
            load_vec(m + i, mf);
            load_vec(v + i, vf);
#pragma unroll
            for (int k = 0; k < N; ++k) {
                const float gk = gf[k] * inv_grad_scale;
                mf[k] = beta1 * mf[k] + one_minus_beta1 * gk;
                vf[k] = beta2 * vf[k] + one_minus_beta2 * gk * gk;
                const float denom = eps_inside_sqrt ? sqrtf(vf[k] + eps) : sqrtf(vf[k]) + eps;
                uf[k] = mf[k] / denom + weight_decay * pf[k];
                p_sq += pf[k] * pf[k];
                u_sq += uf[k] * uf[k];
            }
            store_vec(m + i, mf);
            store_vec(v + i, vf);
            store_vec(u + i, uf);
        });
#ifdef __CUDA_ARCH__
        __shared__ float shared[kThreadsPerBlock / 32];
        p_sq = block_sum(p_sq, shared);
        u_sq = block_sum(u_sq, shared);
        if (threadIdx.x == 0) {
            atomicAdd(norms_sq + id, p_sq);
            atomicAdd(norms_sq + num_tensors + id, u_sq);
        }
#else  // the host harness emulates one thread per block: its sums are the block's
        norms_sq[id] += p_sq;
        norms_sq[num_tensors + id] += u_sq;
#endif
    }
};

template <typename T>
struct LambApplyOp {
    float step_size, min_coeff, max_coeff;
    const float* norms_sq;
    float* coeffs;
    int num_tensors;

    static constexpr int kVec = 16 / sizeof(T);

    DS_HD void operator()(void* const* ptrs, int64_t offset, int64_t n, int id) const {
        T* p = static_cast<T*>(ptrs[0]) + offset;
        const float* u = static_cast<const float*>(ptrs[1]) + offset;
        const float p_norm = sqrtf(norms_sq[id]);
        const float u_norm = sqrtf(norms_sq[num_tensors + id]);
        float coeff = 1.f;
        if (p_norm > 0.f && u_norm > 0.f)
            coeff = fminf(fmaxf(p_norm / u_norm, min_coeff), max_coeff);
        if (offset == 0 && this_lane().index == 0) coeffs[id] = coeff;
        const float scale = step_size * coeff;
        const void* const arrays[2] = {p, u};
        const int bytes[2] = {sizeof(T), sizeof(float)};
        for_each_run<kVec>(arrays, bytes, n, [&](auto width, int64_t i) {
            constexpr int N = decltype(width)::value;
            float pf[N], uf[N];
            load_vec(p + i, pf);
            load_vec(u + i, uf);
#pragma unroll
            for (int k = 0; k < N; ++k) pf[k] = pf[k] - scale * uf[k];
            store_vec(p + i, pf);
        });
    }
};

struct LambHyper {
    float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, inv_grad_scale;
    int eps_inside_sqrt;
    float step_size, min_coeff, max_coeff;
};

// Per-tensor views into the one fp32 scratch buffer (fused_lamb_scratch_elements long).
std::vector<void*> lamb_update_views(float* updates_base, int num_tensors, const int64_t* sizes) {
    std::vector<void*> updates(num_tensors);
    int64_t cursor = 0;
    for (int i = 0; i < num_tensors; ++i) {
        updates[i] = updates_base + cursor;
        cursor += round_up(sizes[i], kScratchAlign);
    }
    return updates;
}

template <typename T, typename S>
LambMomentsOp<T, S> lamb_moments_op(const LambHyper& hp, float* norms_sq, int num_tensors) {
    return {hp.beta1, hp.beta2, hp.one_minus_beta1, hp.one_minus_beta2, hp.eps, hp.weight_decay, hp.inv_grad_scale, hp.eps_inside_sqrt,
            norms_sq, num_tensors};
}

template <typename T>
LambApplyOp<T> lamb_apply_op(const LambHyper& hp, const float* norms_sq, float* coeffs,
                             int num_tensors) {
    return {hp.step_size, hp.min_coeff, hp.max_coeff, norms_sq, coeffs, num_tensors};
}

template <typename T, typename S>
const char* launch_lamb(int64_t min_share, int num_tensors, void* const* const* lists,
                        const int64_t* sizes, float* updates_base, float* norms_sq,
                        float* coeffs, const LambHyper& hp, cudaStream_t stream) {
    std::vector<void*> updates = lamb_update_views(updates_base, num_tensors, sizes);
    void* const* pass1[5] = {lists[0], lists[1], lists[2], lists[3], updates.data()};
    const char* err = multi_tensor_apply<5>(min_share, num_tensors, pass1, sizes, stream,
                                            lamb_moments_op<T, S>(hp, norms_sq, num_tensors));
    if (err == nullptr) {
        void* const* pass2[2] = {lists[0], updates.data()};
        err = multi_tensor_apply<2>(min_share, num_tensors, pass2, sizes, stream,
                                    lamb_apply_op<T>(hp, norms_sq, coeffs, num_tensors));
    }
    return err;
}

template <typename T>
const char* launch_lamb_state(int state_dtype, int64_t min_share, int num_tensors,
                         void* const* const* lists, const int64_t* sizes, float* updates_base,
                         float* norms_sq, float* coeffs, const LambHyper& hp,
                         cudaStream_t stream) {
    if (state_dtype == static_cast<int>(DType::kFloat32))
        return launch_lamb<T, float>(min_share, num_tensors, lists, sizes, updates_base,
                                     norms_sq, coeffs, hp, stream);
    return launch_lamb<T, T>(min_share, num_tensors, lists, sizes, updates_base, norms_sq,
                             coeffs, hp, stream);
}

// The kernels' fp32 hyper-parameters; the bias-corrected step size is computed in double.
LambHyper lamb_hyper(double lr, double beta1, double beta2, double eps, bool eps_inside_sqrt,
                     int64_t step, bool bias_correction, double weight_decay, double max_coeff,
                     double min_coeff, double grad_scale) {
    double step_size = lr;
    if (bias_correction) {
        step_size = lr * sqrt(1.0 - pow(beta2, static_cast<double>(step))) /
                    (1.0 - pow(beta1, static_cast<double>(step)));
    }
    return LambHyper{static_cast<float>(beta1), static_cast<float>(beta2),
                     static_cast<float>(1.0 - beta1), static_cast<float>(1.0 - beta2),
                     static_cast<float>(eps), static_cast<float>(weight_decay),
                     static_cast<float>(1.0 / grad_scale), eps_inside_sqrt ? 1 : 0,
                     static_cast<float>(step_size), static_cast<float>(min_coeff),
                     static_cast<float>(max_coeff)};
}

// fp32 elements of the scratch buffer launch_fused_lamb needs for these tensor sizes.
int64_t fused_lamb_scratch_elements(int num_tensors, const int64_t* sizes) {
    int64_t total = 0;
    for (int i = 0; i < num_tensors; ++i) total += round_up(sizes[i], kScratchAlign);
    return total;
}

// lists: 4 arrays (params, grads, exp_avgs, exp_avg_sqs) of num_tensors device pointers, the
// moments of `state_dtype` (the params' or float32); updates_base: fp32 scratch of
// fused_lamb_scratch_elements() elements, 32-byte aligned; norms_sq: 2*num_tensors zeroed
// floats; coeffs: num_tensors floats receiving the trust ratios; min_share: the fewest
// elements a block is given. Returns nullptr or an error message.
const char* launch_fused_lamb(int dtype, int state_dtype, int64_t min_share, int num_tensors,
                              void* const* const* lists, const int64_t* sizes,
                              float* updates_base, float* norms_sq, float* coeffs, double lr,
                              double beta1, double beta2, double eps, bool eps_inside_sqrt,
                              int64_t step, bool bias_correction, double weight_decay,
                              double max_coeff, double min_coeff, double grad_scale,
                              cudaStream_t stream) {
    if (min_share <= 0) return "fused_lamb: chunk_size must be positive";
    if (step <= 0) return "fused_lamb: step must be >= 1";
    if (grad_scale == 0.0) return "fused_lamb: grad_scale must be non-zero";
    if (state_dtype != dtype && state_dtype != static_cast<int>(DType::kFloat32))
        return "fused_lamb: the moments must have the params' dtype or float32";
    const LambHyper hp = lamb_hyper(lr, beta1, beta2, eps, eps_inside_sqrt, step,
                                    bias_correction, weight_decay, max_coeff, min_coeff,
                                    grad_scale);
    switch (static_cast<DType>(dtype)) {
        case DType::kFloat32:
            return launch_lamb<float, float>(min_share, num_tensors, lists, sizes, updates_base,
                                             norms_sq, coeffs, hp, stream);
        case DType::kFloat16:
            return launch_lamb_state<__half>(state_dtype, min_share, num_tensors, lists, sizes,
                                             updates_base, norms_sq, coeffs, hp, stream);
        case DType::kBFloat16:
            return launch_lamb_state<__nv_bfloat16>(state_dtype, min_share, num_tensors, lists,
                                                    sizes, updates_base, norms_sq, coeffs, hp,
                                                    stream);
    }
    return "fused_lamb: unsupported dtype code (allowed: float32, float16, bfloat16)";
}

}  // namespace ds_optim
