// float8/kernels/cast_device.cuh — device helpers the float8 cast kernels share (nvcc only):
// loading any source dtype as float, and the NaN-propagating max of torch.amax.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace titan::float8::kernels::device {

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }

// max of non-negative values that propagates NaN like torch.amax.
__device__ __forceinline__ float nan_max(float a, float b) { return (a > b || isnan(a)) ? a : b; }

}  // namespace titan::float8::kernels::device
