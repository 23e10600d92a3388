// model/kernels/fused_ops_kernels.cu — CUDA twins of the fused CPU kernels (fused_ops_cpu.cpp):
// RMSNorm, RoPE and SwiGLU forward and backward, float32 or bfloat16 activations, same formulas.
#include "model/kernels/fused_ops_kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "util/cuda_check.h"  // TITAN_CUDA_CHECK: every launch goes through it

namespace titan::model::kernels {
namespace {

constexpr int kBlock = 256;

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kBlock - 1) / kBlock, 65535)); }

// Block-wide sum; every thread gets the result. blockDim.x a multiple of 32, <= 1024.
__device__ float block_sum(float v) {
  __shared__ float warp_sum[32];
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // warp_sum may still be read by a previous call
  if (lane == 0) warp_sum[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? warp_sum[lane] : 0.0f;
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Element access: bf16 widens exactly; a bf16 store rounds the float32 result once to nearest
// even. The same template code runs for float32, so a bf16 kernel's output is the float32
// kernel's on the widened inputs, rounded (the CPU kernels' contract, tested on the GPU).
__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// One block per row.
template <typename T>
__global__ void rms_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ w, int64_t dim, float eps,
                                        T* __restrict__ y, float* __restrict__ rstd) {
  const T* xr = x + blockIdx.x * dim;
  T* yr = y + blockIdx.x * dim;
  float ss = 0.f;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    const float v = load(xr, d);
    ss += v * v;
  }
  const float inv = 1.f / sqrtf(block_sum(ss) / static_cast<float>(dim) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = inv;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) store(yr, d, (load(xr, d) * inv) * load(w, d));
}

// One block per group of kRmsNormGradWeightBlockRows rows: gx, and the group's share of gw as
// float32 partial sums (the group's rows added in row order; the groups summed in order after).
template <typename T>
__global__ void rms_norm_backward_kernel(const T* __restrict__ g, const T* __restrict__ x, const T* __restrict__ w,
                                         const float* __restrict__ rstd, int64_t rows, int64_t dim,
                                         T* __restrict__ gx, float* __restrict__ gw_partial) {
  const int64_t r0 = blockIdx.x * kRmsNormGradWeightBlockRows;
  const int64_t r1 = min(rows, r0 + kRmsNormGradWeightBlockRows);
  float* acc = gw_partial + blockIdx.x * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) acc[d] = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    const T* gr = g + r * dim;
    const T* xr = x + r * dim;
    const float inv = rstd[r];
    float dot = 0.f;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dot += (load(gr, d) * load(w, d)) * load(xr, d);
    const float c = inv * inv * inv * block_sum(dot) / static_cast<float>(dim);
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      const float gv = load(gr, d), xv = load(xr, d);
      store(gx, r * dim + d, inv * (gv * load(w, d)) - xv * c);
      acc[d] += gv * (xv * inv);
    }
  }
}

template <typename T>
__global__ void sum_partials_kernel(const float* __restrict__ partial, int64_t blocks, int64_t dim,
                                    T* __restrict__ gw) {
  for (int64_t d = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; d < dim; d += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int64_t b = 0; b < blocks; ++b) s += partial[b * dim + d];
    store(gw, d, s);
  }
}

template <typename T>
__global__ void rotary_kernel(const T* __restrict__ x, const float* __restrict__ cos, const float* __restrict__ sin,
                              int64_t pairs, int64_t seq, int64_t inner, int64_t half, bool inverse,
                              T* __restrict__ y) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < pairs; p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = p % half, row = p / half, s = (row / inner) % seq;
    const float e = load(x, 2 * p), o = load(x, 2 * p + 1), c = cos[s * half + i], sn = sin[s * half + i];
    // products rounded separately, as the CPU kernel and the composite (no FMA contraction)
    const float ec = __fmul_rn(e, c), os = __fmul_rn(o, sn), es = __fmul_rn(e, sn), oc = __fmul_rn(o, c);
    store(y, 2 * p, inverse ? __fadd_rn(ec, os) : __fsub_rn(ec, os));
    store(y, 2 * p + 1, inverse ? __fsub_rn(oc, es) : __fadd_rn(es, oc));
  }
}

template <typename T>
__global__ void swiglu_forward_kernel(const T* __restrict__ gate, const T* __restrict__ up, int64_t n,
                                      T* __restrict__ y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load(gate, i);
    store(y, i, (g / (1.f + expf(-g))) * load(up, i));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* __restrict__ dy, const T* __restrict__ gate, const T* __restrict__ up,
                                       int64_t n, T* __restrict__ dgate, T* __restrict__ dup) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = load(gate, i), d = load(dy, i), e = 1.f + expf(-g), sig = 1.f / e;
    store(dgate, i, (d * load(up, i)) * (sig * (1.f + g * (1.f - sig))));
    store(dup, i, d * (g / e));
  }
}

// Calls fn with a null pointer of the element type.
template <typename Fn>
void by_elem(Elem elem, const Fn& fn) {
  if (elem == Elem::kBFloat16)
    fn(static_cast<__nv_bfloat16*>(nullptr));
  else
    fn(static_cast<float*>(nullptr));
}

}  // namespace

void launch_rms_norm_forward(Elem elem, const void* x, const void* w, int64_t rows, int64_t dim, float eps, void* y,
                             float* rstd, void* stream) {
  if (rows == 0) return;
  by_elem(elem, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    rms_norm_forward_kernel<T><<<static_cast<unsigned>(rows), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), dim, eps, static_cast<T*>(y), rstd);
  });
  TITAN_CUDA_CHECK(cudaGetLastError(), "rms_norm_forward_kernel launch");
}

void launch_rms_norm_backward(Elem elem, const void* g, const void* x, const void* w, const float* rstd,
                              int64_t rows, int64_t dim, void* gx, float* gw_partial, void* gw, void* stream) {
  const int64_t blocks = (rows + kRmsNormGradWeightBlockRows - 1) / kRmsNormGradWeightBlockRows;
  auto s = static_cast<cudaStream_t>(stream);
  by_elem(elem, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    if (blocks > 0) {
      rms_norm_backward_kernel<T><<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(
          static_cast<const T*>(g), static_cast<const T*>(x), static_cast<const T*>(w), rstd, rows, dim,
          static_cast<T*>(gx), gw_partial);
      TITAN_CUDA_CHECK(cudaGetLastError(), "rms_norm_backward_kernel launch");
    }
    sum_partials_kernel<T><<<grid_for(dim), kBlock, 0, s>>>(gw_partial, blocks, dim, static_cast<T*>(gw));
  });
  TITAN_CUDA_CHECK(cudaGetLastError(), "sum_partials_kernel launch");
}

void launch_rotary(Elem elem, const void* x, const float* cos, const float* sin, int64_t outer, int64_t seq,
                   int64_t inner, int64_t half, bool inverse, void* y, void* stream) {
  const int64_t pairs = outer * seq * inner * half;
  if (pairs == 0) return;
  by_elem(elem, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    rotary_kernel<T><<<grid_for(pairs), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(x), cos, sin, pairs, seq, inner, half, inverse, static_cast<T*>(y));
  });
  TITAN_CUDA_CHECK(cudaGetLastError(), "rotary_kernel launch");
}

void launch_swiglu_forward(Elem elem, const void* gate, const void* up, int64_t n, void* y, void* stream) {
  if (n == 0) return;
  by_elem(elem, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    swiglu_forward_kernel<T><<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), n, static_cast<T*>(y));
  });
  TITAN_CUDA_CHECK(cudaGetLastError(), "swiglu_forward_kernel launch");
}

void launch_swiglu_backward(Elem elem, const void* dy, const void* gate, const void* up, int64_t n, void* dgate,
                            void* dup, void* stream) {
  if (n == 0) return;
  by_elem(elem, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    swiglu_backward_kernel<T><<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(dy), static_cast<const T*>(gate), static_cast<const T*>(up), n, static_cast<T*>(dgate),
        static_cast<T*>(dup));
  });
  TITAN_CUDA_CHECK(cudaGetLastError(), "swiglu_backward_kernel launch");
}

}  // namespace titan::model::kernels
