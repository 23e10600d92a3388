// model/kernels/fused_ops_kernels.cu — CUDA twins of the fused CPU kernels (fused_ops_cpu.cpp):
// RMSNorm, RoPE and SwiGLU forward and backward, float32, same formulas.
#include "model/kernels/fused_ops_kernels.cuh"

#include <cuda_runtime.h>

#include <algorithm>

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

// One block per row.
__global__ void rms_norm_forward_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                        int64_t dim, float eps, float* __restrict__ y,
                                        float* __restrict__ rstd) {
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  float ss = 0.f;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) ss += xr[d] * xr[d];
  const float inv = 1.f / sqrtf(block_sum(ss) / static_cast<float>(dim) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = inv;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) yr[d] = (xr[d] * inv) * w[d];
}

// One block per row: gx; gw partial sums of 32-row groups by atomics-free per-row writes into
// gw_partial[row group] (one block per group of rows would serialize; the group's rows add in
// row order through the loop below instead).
__global__ void rms_norm_backward_kernel(const float* __restrict__ g, const float* __restrict__ x,
                                         const float* __restrict__ w, const float* __restrict__ rstd,
                                         int64_t rows, int64_t dim, float* __restrict__ gx,
                                         float* __restrict__ gw_partial) {
  // blockIdx.x = row group; rows of the group in order.
  const int64_t r0 = blockIdx.x * kRmsNormGradWeightBlockRows;
  const int64_t r1 = min(rows, r0 + kRmsNormGradWeightBlockRows);
  float* acc = gw_partial + blockIdx.x * dim;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) acc[d] = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    const float* gr = g + r * dim;
    const float* xr = x + r * dim;
    const float inv = rstd[r];
    float dot = 0.f;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) dot += (gr[d] * w[d]) * xr[d];
    const float c = inv * inv * inv * block_sum(dot) / static_cast<float>(dim);
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      gx[r * dim + d] = inv * (gr[d] * w[d]) - xr[d] * c;
      acc[d] += gr[d] * (xr[d] * inv);
    }
  }
}

__global__ void sum_partials_kernel(const float* __restrict__ partial, int64_t blocks, int64_t dim,
                                    float* __restrict__ gw) {
  for (int64_t d = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; d < dim; d += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int64_t b = 0; b < blocks; ++b) s += partial[b * dim + d];
    gw[d] = s;
  }
}

__global__ void rotary_kernel(const float* __restrict__ x, const float* __restrict__ cos,
                              const float* __restrict__ sin, int64_t pairs, int64_t seq,
                              int64_t inner, int64_t half, bool inverse, float* __restrict__ y) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < pairs; p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = p % half, row = p / half, s = (row / inner) % seq;
    const float e = x[2 * p], o = x[2 * p + 1], c = cos[s * half + i], sn = sin[s * half + i];
    // products rounded separately, as the CPU kernel and the composite (no FMA contraction)
    const float ec = __fmul_rn(e, c), os = __fmul_rn(o, sn), es = __fmul_rn(e, sn), oc = __fmul_rn(o, c);
    y[2 * p] = inverse ? __fadd_rn(ec, os) : __fsub_rn(ec, os);
    y[2 * p + 1] = inverse ? __fsub_rn(oc, es) : __fadd_rn(es, oc);
  }
}

__global__ void swiglu_forward_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                      int64_t n, float* __restrict__ y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = (gate[i] / (1.f + expf(-gate[i]))) * up[i];
}

__global__ void swiglu_backward_kernel(const float* __restrict__ dy, const float* __restrict__ gate,
                                       const float* __restrict__ up, int64_t n,
                                       float* __restrict__ dgate, float* __restrict__ dup) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i], e = 1.f + expf(-g), sig = 1.f / e;
    dgate[i] = (dy[i] * up[i]) * (sig * (1.f + g * (1.f - sig)));
    dup[i] = dy[i] * (g / e);
  }
}

}  // namespace

void launch_rms_norm_forward(const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                             float* y, float* rstd, void* stream) {
  if (rows == 0) return;
  rms_norm_forward_kernel<<<static_cast<unsigned>(rows), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(
      x, w, dim, eps, y, rstd);
  TITAN_CUDA_CHECK(cudaGetLastError(), "rms_norm_forward_kernel launch");
}

void launch_rms_norm_backward(const float* g, const float* x, const float* w, const float* rstd,
                              int64_t rows, int64_t dim, float* gx, float* gw_partial, float* gw,
                              void* stream) {
  const int64_t blocks = (rows + kRmsNormGradWeightBlockRows - 1) / kRmsNormGradWeightBlockRows;
  auto s = static_cast<cudaStream_t>(stream);
  if (blocks > 0) {
    rms_norm_backward_kernel<<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(g, x, w, rstd, rows, dim,
                                                                              gx, gw_partial);
    TITAN_CUDA_CHECK(cudaGetLastError(), "rms_norm_backward_kernel launch");
  }
  sum_partials_kernel<<<grid_for(dim), kBlock, 0, s>>>(gw_partial, blocks, dim, gw);
  TITAN_CUDA_CHECK(cudaGetLastError(), "sum_partials_kernel launch");
}

void launch_rotary(const float* x, const float* cos, const float* sin, int64_t outer, int64_t seq,
                   int64_t inner, int64_t half, bool inverse, float* y, void* stream) {
  const int64_t pairs = outer * seq * inner * half;
  if (pairs == 0) return;
  rotary_kernel<<<grid_for(pairs), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(x, cos, sin, pairs, seq,
                                                                                   inner, half, inverse, y);
  TITAN_CUDA_CHECK(cudaGetLastError(), "rotary_kernel launch");
}

void launch_swiglu_forward(const float* gate, const float* up, int64_t n, float* y, void* stream) {
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(gate, up, n, y);
  TITAN_CUDA_CHECK(cudaGetLastError(), "swiglu_forward_kernel launch");
}

void launch_swiglu_backward(const float* dy, const float* gate, const float* up, int64_t n,
                            float* dgate, float* dup, void* stream) {
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n), kBlock, 0, static_cast<cudaStream_t>(stream)>>>(dy, gate, up, n,
                                                                                         dgate, dup);
  TITAN_CUDA_CHECK(cudaGetLastError(), "swiglu_backward_kernel launch");
}

}  // namespace titan::model::kernels
