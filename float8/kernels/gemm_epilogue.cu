// float8/kernels/gemm_epilogue.cu — see gemm_epilogue.cuh. CPU reference: the composite it
// replaces in gemm.cpp ((out * inv_a * inv_b).to(out_dtype)); [cuda] test in test_float8.cpp.
#include "float8/kernels/gemm_epilogue.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "util/cuda_check.h"  // TITAN_CUDA_CHECK: every launch goes through it

namespace titan::float8::kernels {
namespace {

constexpr int kBlock = 256;

__device__ __forceinline__ float scaled(float x, float a, float b) { return __fmul_rn(__fmul_rn(x, a), b); }

__device__ __forceinline__ void store(float v, float* out, int64_t i) { out[i] = v; }
__device__ __forceinline__ void store(float v, __nv_bfloat16* out, int64_t i) { out[i] = __float2bfloat16_rn(v); }

// Four consecutive elements of one row per thread (cols % 4 == 0, x 16-byte aligned).
template <typename Out>
__global__ void outer_scale_vec4_kernel(const float* __restrict__ x, int64_t rows, int64_t cols,
                                        const float* __restrict__ row_scale, const float* __restrict__ col_scale,
                                        Out* out) {
  const int64_t quads = rows * cols / 4;
  for (int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; q < quads; q += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = q * 4, r = i / cols, c = i % cols;
    const float4 v = *reinterpret_cast<const float4*>(x + i);
    const float a = row_scale[r];
    store(scaled(v.x, a, col_scale[c]), out, i);
    store(scaled(v.y, a, col_scale[c + 1]), out, i + 1);
    store(scaled(v.z, a, col_scale[c + 2]), out, i + 2);
    store(scaled(v.w, a, col_scale[c + 3]), out, i + 3);
  }
}

template <typename Out>
__global__ void outer_scale_kernel(const float* __restrict__ x, int64_t rows, int64_t cols,
                                   const float* __restrict__ row_scale, const float* __restrict__ col_scale, Out* out) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    store(scaled(x[i], row_scale[i / cols], col_scale[i % cols]), out, i);
}

unsigned grid_for(int64_t items) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((items + kBlock - 1) / kBlock, 65535LL * 8)));
}

}  // namespace

void launch_outer_scale(const float* x, int64_t rows, int64_t cols, const float* row_scale,
                        const float* col_scale, EpilogueOut dst, void* out, void* stream) {
  if (rows * cols == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const bool vec = cols % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (dst == EpilogueOut::Float32) {
    auto* o = static_cast<float*>(out);
    if (vec) outer_scale_vec4_kernel<<<grid_for(rows * cols / 4), kBlock, 0, s>>>(x, rows, cols, row_scale, col_scale, o);
    else outer_scale_kernel<<<grid_for(rows * cols), kBlock, 0, s>>>(x, rows, cols, row_scale, col_scale, o);
  } else {
    auto* o = static_cast<__nv_bfloat16*>(out);
    if (vec) outer_scale_vec4_kernel<<<grid_for(rows * cols / 4), kBlock, 0, s>>>(x, rows, cols, row_scale, col_scale, o);
    else outer_scale_kernel<<<grid_for(rows * cols), kBlock, 0, s>>>(x, rows, cols, row_scale, col_scale, o);
  }
  TITAN_CUDA_CHECK(cudaGetLastError(), "outer_scale kernel over [" << rows << ", " << cols << "]");
}

}  // namespace titan::float8::kernels
