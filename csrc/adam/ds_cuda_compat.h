// Small portability layer so the kernels build with nvcc alone (no torch headers): the element
// types the optimizers accept and their fp32 conversions, 16-byte vector loads and stores, plus
// an error-check macro that turns a CUDA error into a message naming the launch site rather
// than a later, unrelated failure.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace ds_optim {

// Codes the frontend passes for the element type of every tensor of one launch.
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Everything below is host and device code: a test harness
// (tests/op_builder/fixtures/fused_kernels_host.cu) runs the kernels' per-block code on a CPU,
// one emulated thread at a time, to check it without a GPU.
#define DS_HD __host__ __device__ __forceinline__

DS_HD float to_float(float v) { return v; }
DS_HD float to_float(__half v) { return __half2float(v); }
DS_HD float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
DS_HD T from_float(float v);
template <>
DS_HD float from_float<float>(float v) { return v; }
template <>
DS_HD __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
DS_HD __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// A thread's index in its block and the block's thread count.
struct Lane {
    int64_t index = 0;
    int64_t count = 1;
};

// The thread a host harness emulates.
inline Lane& host_lane() {
    static thread_local Lane lane;
    return lane;
}

// The calling thread: CUDA's built-ins on the device, the emulated thread on the host.
DS_HD Lane this_lane() {
#ifdef __CUDA_ARCH__
    return Lane{threadIdx.x, blockDim.x};
#else
    return host_lane();
#endif
}

template <int N>
using Width = std::integral_constant<int, N>;

// N consecutive elements of type T as floats: 16-byte loads where N elements are whole 16-byte
// words (the caller guarantees `src` is then 16-byte aligned), element loads otherwise.
template <int N, typename T>
DS_HD void load_vec(const T* src, float (&out)[N]) {
    if constexpr (N * sizeof(T) % 16 == 0) {
        uint4 raw[N * sizeof(T) / 16];
#pragma unroll
        for (int w = 0; w < static_cast<int>(N * sizeof(T) / 16); ++w)
            raw[w] = reinterpret_cast<const uint4*>(src)[w];
        const T* values = reinterpret_cast<const T*>(raw);
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = to_float(values[i]);
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = to_float(src[i]);
    }
}

// The inverse of load_vec: N floats rounded to T.
template <int N, typename T>
DS_HD void store_vec(T* dst, const float (&in)[N]) {
    if constexpr (N * sizeof(T) % 16 == 0) {
        uint4 raw[N * sizeof(T) / 16];
        T* values = reinterpret_cast<T*>(raw);
#pragma unroll
        for (int i = 0; i < N; ++i) values[i] = from_float<T>(in[i]);
#pragma unroll
        for (int w = 0; w < static_cast<int>(N * sizeof(T) / 16); ++w)
            reinterpret_cast<uint4*>(dst)[w] = raw[w];
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) dst[i] = from_float<T>(in[i]);
    }
}

// Covers elements [0, n) of K arrays (base addresses `ptrs`, element sizes `bytes`) with the
// block's threads: body(Width<V>{}, i) on runs of V elements where every array is 16-byte
// aligned, body(Width<1>{}, i) on the elements before the first such run and after the last.
// A segment that starts misaligned (a view into a flat buffer) is peeled, not run element by
// element, as long as one peel aligns every array; thread t takes runs t, t + blockDim.x, ...
// so every access is coalesced across the warp.
template <int V, int K, typename Body>
DS_HD void for_each_run(const void* const (&ptrs)[K], const int (&bytes)[K], int64_t n,
                        const Body& body) {
    int64_t head = n;  // no peel aligns every array: element by element
    for (int a = 0; a < V && a < n; ++a) {
        bool aligned = true;
#pragma unroll
        for (int k = 0; k < K; ++k)
            aligned &= ((reinterpret_cast<uintptr_t>(ptrs[k]) + a * bytes[k]) & 15u) == 0;
        if (aligned) {
            head = a;
            break;
        }
    }
    const Lane self = this_lane();
    const int64_t lane = self.index, stride = self.count;
    const int64_t vectors = (n - head) / V;
    for (int64_t i = lane; i < head; i += stride) body(Width<1>{}, i);
    for (int64_t j = lane; j < vectors; j += stride) body(Width<V>{}, head + j * V);
    for (int64_t i = head + vectors * V + lane; i < n; i += stride) body(Width<1>{}, i);
}

}  // namespace ds_optim

// Returns the CUDA error string of the last launch (nullptr when it succeeded).
#define DS_CUDA_LAST_ERROR() \
    ([]() -> const char* { cudaError_t e = cudaGetLastError(); \
                           return e == cudaSuccess ? nullptr : cudaGetErrorString(e); }())
