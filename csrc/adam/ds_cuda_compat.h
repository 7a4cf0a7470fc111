// Small portability layer so the kernels build with nvcc alone (no torch headers): the element
// types the optimizers accept and their fp32 conversions, plus an error-check macro that turns a
// CUDA error into a message naming the launch site rather than a later, unrelated failure.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace ds_optim {

// Codes the frontend passes for the element type of every tensor of one launch.
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

}  // namespace ds_optim

// Returns the CUDA error string of the last launch (nullptr when it succeeded).
#define DS_CUDA_LAST_ERROR() \
    ([]() -> const char* { cudaError_t e = cudaGetLastError(); \
                           return e == cudaSuccess ? nullptr : cudaGetErrorString(e); }())
