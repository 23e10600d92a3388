// float8/kernels/cast_device.cuh — helpers the float8 cast kernels share (nvcc only): loading any
// source dtype as float, the NaN-propagating max of torch.amax, and the dtype dispatch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>

#include "float8/kernels/cast_kernels.cuh"  // SrcType

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

// Calls f with a null pointer of the C++ type of `src`, so a launcher instantiates its kernel
// for the tensor's dtype.
template <typename F>
void dispatch_src(SrcType src, F&& f) {
  switch (src) {
    case SrcType::Float32: f(static_cast<float*>(nullptr)); return;
    case SrcType::BFloat16: f(static_cast<__nv_bfloat16*>(nullptr)); return;
    case SrcType::Float16: f(static_cast<__half*>(nullptr)); return;
  }
  throw std::invalid_argument("float8 cast kernels: unknown source dtype");
}

}  // namespace titan::float8::kernels::device
