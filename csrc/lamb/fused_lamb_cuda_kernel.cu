// DeepSpeed's LAMB over lists of (param, grad, exp_avg, exp_avg_sq) tensors of one dtype, fp32
// arithmetic. Two multi-tensor passes, because the trust ratio of a tensor needs the norms of the
// whole tensor before any of its elements may move:
//   pass 1: g = g/grad_scale; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2 (no bias correction)
//           denom = sqrt(v + eps) if eps_inside_sqrt else sqrt(v) + eps
//           u = m/denom + wd*p   (written to an fp32 scratch buffer)
//           sum p^2 and u^2 per tensor (block reduction, one atomicAdd per block)
//   pass 2: coeff = clamp(|p|/|u|, min_coeff, max_coeff), or 1 when either norm is 0
//           p = p - step_size*coeff*u, coeff recorded per tensor
#include "../adam/ds_cuda_compat.h"
#include "../adam/multi_tensor_apply.cuh"

#include <vector>

namespace ds_optim {
namespace {

// Sum of `value` over the block; every thread gets the result (needs kThreadsPerBlock threads).
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

template <typename T>
struct LambMomentsOp {
    float beta1, beta2, eps, weight_decay, inv_grad_scale;
    int eps_inside_sqrt;
    float* norms_sq;  // [2 * num_tensors]: param sums of squares, then update sums of squares
    int num_tensors;

    __device__ void operator()(void* const* ptrs, int64_t offset, int64_t n, int id) const {
        __shared__ float shared[kThreadsPerBlock / 32];
        const T* p = static_cast<const T*>(ptrs[0]) + offset;
        const T* g = static_cast<const T*>(ptrs[1]) + offset;
        T* m = static_cast<T*>(ptrs[2]) + offset;
        T* v = static_cast<T*>(ptrs[3]) + offset;
        float* u = static_cast<float*>(ptrs[4]) + offset;
        float p_sq = 0.f, u_sq = 0.f;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const float pf = to_float(p[i]);
            const float gf = to_float(g[i]) * inv_grad_scale;
            const float mf = beta1 * to_float(m[i]) + (1.f - beta1) * gf;
            const float vf = beta2 * to_float(v[i]) + (1.f - beta2) * gf * gf;
            const float denom = eps_inside_sqrt ? sqrtf(vf + eps) : sqrtf(vf) + eps;
            const float uf = mf / denom + weight_decay * pf;
            m[i] = from_float<T>(mf);
            v[i] = from_float<T>(vf);
            u[i] = uf;
            p_sq += pf * pf;
            u_sq += uf * uf;
        }
        p_sq = block_sum(p_sq, shared);
        u_sq = block_sum(u_sq, shared);
        if (threadIdx.x == 0) {
            atomicAdd(norms_sq + id, p_sq);
            atomicAdd(norms_sq + num_tensors + id, u_sq);
        }
    }
};

template <typename T>
struct LambApplyOp {
    float step_size, min_coeff, max_coeff;
    const float* norms_sq;
    float* coeffs;
    int num_tensors;

    __device__ void operator()(void* const* ptrs, int64_t offset, int64_t n, int id) const {
        T* p = static_cast<T*>(ptrs[0]) + offset;
        const float* u = static_cast<const float*>(ptrs[1]) + offset;
        const float p_norm = sqrtf(norms_sq[id]);
        const float u_norm = sqrtf(norms_sq[num_tensors + id]);
        float coeff = 1.f;
        if (p_norm > 0.f && u_norm > 0.f)
            coeff = fminf(fmaxf(p_norm / u_norm, min_coeff), max_coeff);
        if (offset == 0 && threadIdx.x == 0) coeffs[id] = coeff;
        const float scale = step_size * coeff;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            p[i] = from_float<T>(to_float(p[i]) - scale * u[i]);
    }
};

template <typename T>
const char* launch_typed(int64_t chunk_size, int num_tensors, void* const* const* lists,
                         const int64_t* sizes, float* updates_base, float* norms_sq,
                         float* coeffs, const LambMomentsOp<float>& hp, float step_size,
                         float min_coeff, float max_coeff, cudaStream_t stream) {
    // Per-tensor views into the one fp32 scratch buffer the caller allocated.
    std::vector<void*> storage(num_tensors);
    void** updates = storage.data();
    int64_t cursor = 0;
    for (int i = 0; i < num_tensors; ++i) {
        updates[i] = updates_base + cursor;
        cursor += sizes[i];
    }
    void* const* pass1[5] = {lists[0], lists[1], lists[2], lists[3], updates};
    LambMomentsOp<T> moments{hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.inv_grad_scale,
                             hp.eps_inside_sqrt, norms_sq, num_tensors};
    const char* err =
        multi_tensor_apply<5>(chunk_size, num_tensors, pass1, sizes, stream, moments);
    if (err == nullptr) {
        void* const* pass2[2] = {lists[0], updates};
        LambApplyOp<T> apply{step_size, min_coeff, max_coeff, norms_sq, coeffs, num_tensors};
        err = multi_tensor_apply<2>(chunk_size, num_tensors, pass2, sizes, stream, apply);
    }
    return err;
}

}  // namespace

// lists: 4 arrays (params, grads, exp_avgs, exp_avg_sqs) of num_tensors device pointers;
// updates_base: fp32 scratch of sum(sizes) elements; norms_sq: 2*num_tensors zeroed floats;
// coeffs: num_tensors floats receiving the trust ratios. Returns nullptr or an error message.
const char* launch_fused_lamb(int dtype, int64_t chunk_size, int num_tensors,
                              void* const* const* lists, const int64_t* sizes,
                              float* updates_base, float* norms_sq, float* coeffs, double lr,
                              double beta1, double beta2, double eps, bool eps_inside_sqrt,
                              int64_t step, bool bias_correction, double weight_decay,
                              double max_coeff, double min_coeff, double grad_scale,
                              cudaStream_t stream) {
    if (chunk_size <= 0) return "fused_lamb: chunk_size must be positive";
    if (step <= 0) return "fused_lamb: step must be >= 1";
    if (grad_scale == 0.0) return "fused_lamb: grad_scale must be non-zero";
    double step_size = lr;
    if (bias_correction) {
        step_size = lr * sqrt(1.0 - pow(beta2, static_cast<double>(step))) /
                    (1.0 - pow(beta1, static_cast<double>(step)));
    }
    LambMomentsOp<float> hp{static_cast<float>(beta1), static_cast<float>(beta2),
                            static_cast<float>(eps), static_cast<float>(weight_decay),
                            static_cast<float>(1.0 / grad_scale), eps_inside_sqrt ? 1 : 0,
                            norms_sq, num_tensors};
    const float ss = static_cast<float>(step_size);
    const float lo = static_cast<float>(min_coeff), hi = static_cast<float>(max_coeff);
    switch (static_cast<DType>(dtype)) {
        case DType::kFloat32:
            return launch_typed<float>(chunk_size, num_tensors, lists, sizes, updates_base,
                                       norms_sq, coeffs, hp, ss, lo, hi, stream);
        case DType::kFloat16:
            return launch_typed<__half>(chunk_size, num_tensors, lists, sizes, updates_base,
                                        norms_sq, coeffs, hp, ss, lo, hi, stream);
        case DType::kBFloat16:
            return launch_typed<__nv_bfloat16>(chunk_size, num_tensors, lists, sizes,
                                               updates_base, norms_sq, coeffs, hp, ss, lo, hi,
                                               stream);
    }
    return "fused_lamb: unsupported dtype code (allowed: float32, float16, bfloat16)";
}

}  // namespace ds_optim
