// trainer/optim/adamw_kernels_cuda.cu — see adamw_kernels_cuda.cuh.
#include "trainer/optim/adamw_kernels_cuda.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "util/cuda_check.h"  // TITAN_CUDA_CHECK: every launch goes through it

namespace titan::trainer::optim::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;                                  // elements per thread per iteration
constexpr int64_t kChunk = int64_t{kThreads} * kVec * 8;  // elements per block
// Tensors per launch: their descriptors travel as the kernel's argument (4 KiB at most).
constexpr int kMaxTensors = 32;

struct Launch {
  AdamWCudaTensor tensor[kMaxTensors];
  int64_t first_block[kMaxTensors + 1];  // tensor i owns blocks [first_block[i], first_block[i + 1])
  int count;
  bool vectorized[kMaxTensors];  // every pointer aligned for 16-byte (float) / 8-byte (bf16) access
};
static_assert(sizeof(Launch) + sizeof(AdamWStep) < 4000, "kernel arguments must stay under 4 KiB");

__device__ __forceinline__ float bf16_to_float(uint16_t bits) { return __uint_as_float(uint32_t{bits} << 16); }

// Round to nearest even, as c10::BFloat16's conversion (NaN becomes the canonical quiet NaN).
__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  if (f != f) return 0x7FC0;
  uint32_t u = __float_as_uint(f);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The CPU kernel's operations in its order (adamw_kernels.cpp update_span).
__device__ __forceinline__ void update(float& p, float g, float& m, float& v, const AdamWStep& s, float coeff,
                                       bool small, float neg_step, float bc2) {
  if (s.grad_scale != 1.f) g = __fmul_rn(g, s.grad_scale);
  if (s.grad_decay != 0.f) g = __fadd_rn(g, __fmul_rn(p, s.grad_decay));
  if (s.lr_decay != 1.f) p = __fmul_rn(p, s.lr_decay);
  m = __fmaf_rn(coeff, __fsub_rn(g, m), small ? m : g);
  v = __fadd_rn(__fmul_rn(v, s.beta2), __fmul_rn(__fmul_rn(s.beta2_weight, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), bc2), s.eps);
  p = __fadd_rn(p, __fdiv_rn(__fmul_rn(neg_step, m), denom));
}

__global__ void __launch_bounds__(kThreads) adamw_bf16_grad_kernel(const Launch launch, const AdamWStep s) {
  int t = 0;
  while (t + 1 < launch.count && launch.first_block[t + 1] <= static_cast<int64_t>(blockIdx.x)) ++t;
  const AdamWCudaTensor& x = launch.tensor[t];
  const int64_t begin = (static_cast<int64_t>(blockIdx.x) - launch.first_block[t]) * kChunk;
  const int64_t end = min(x.n, begin + kChunk);
  // ATen's lerp for exp_avg.lerp_(grad, w): w < 0.5: m + w (g - m), else g + (w - 1) (g - m).
  const bool small = fabsf(s.beta1_weight) < 0.5f;
  const float coeff = small ? s.beta1_weight : __fsub_rn(s.beta1_weight, 1.f);
  for (int64_t i = begin + int64_t{threadIdx.x} * kVec; i < end; i += int64_t{kThreads} * kVec) {
    if (launch.vectorized[t] && i + kVec <= end) {
      float4 p = *reinterpret_cast<const float4*>(x.param + i);
      float4 m = *reinterpret_cast<const float4*>(x.exp_avg + i);
      float4 v = *reinterpret_cast<const float4*>(x.exp_avg_sq + i);
      const ushort4 g = *reinterpret_cast<const ushort4*>(x.grad + i);
      update(p.x, bf16_to_float(g.x), m.x, v.x, s, coeff, small, x.neg_step_size, x.bias_correction2_sqrt);
      update(p.y, bf16_to_float(g.y), m.y, v.y, s, coeff, small, x.neg_step_size, x.bias_correction2_sqrt);
      update(p.z, bf16_to_float(g.z), m.z, v.z, s, coeff, small, x.neg_step_size, x.bias_correction2_sqrt);
      update(p.w, bf16_to_float(g.w), m.w, v.w, s, coeff, small, x.neg_step_size, x.bias_correction2_sqrt);
      *reinterpret_cast<float4*>(x.param + i) = p;
      *reinterpret_cast<float4*>(x.exp_avg + i) = m;
      *reinterpret_cast<float4*>(x.exp_avg_sq + i) = v;
      *reinterpret_cast<ushort4*>(x.copy + i) =
          make_ushort4(float_to_bf16(p.x), float_to_bf16(p.y), float_to_bf16(p.z), float_to_bf16(p.w));
      continue;
    }
    for (int64_t j = i; j < min(end, i + kVec); ++j) {
      float p = x.param[j], m = x.exp_avg[j], v = x.exp_avg_sq[j];
      update(p, bf16_to_float(x.grad[j]), m, v, s, coeff, small, x.neg_step_size, x.bias_correction2_sqrt);
      x.param[j] = p;
      x.exp_avg[j] = m;
      x.exp_avg_sq[j] = v;
      x.copy[j] = float_to_bf16(p);
    }
  }
}

bool aligned(const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

}  // namespace

void launch_adamw_bf16_grad(const AdamWCudaTensor* tensors, int64_t count, const AdamWStep& common,
                            void* stream) {
  for (int64_t first = 0; first < count; first += kMaxTensors) {
    Launch launch{};
    launch.count = static_cast<int>(std::min<int64_t>(kMaxTensors, count - first));
    int64_t blocks = 0;
    for (int i = 0; i < launch.count; ++i) {
      const AdamWCudaTensor& x = tensors[first + i];
      launch.tensor[i] = x;
      launch.first_block[i] = blocks;
      launch.vectorized[i] = aligned(x.param, 16) && aligned(x.exp_avg, 16) && aligned(x.exp_avg_sq, 16) &&
                             aligned(x.grad, 8) && aligned(x.copy, 8);
      blocks += (x.n + kChunk - 1) / kChunk;
    }
    launch.first_block[launch.count] = blocks;
    if (blocks == 0) continue;
    adamw_bf16_grad_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        launch, common);
    TITAN_CUDA_CHECK(cudaGetLastError(), "adamw_bf16_grad_kernel over " << launch.count << " tensors, " << blocks
                                                                        << " blocks");
  }
}

}  // namespace titan::trainer::optim::kernels
