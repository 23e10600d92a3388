// trainer/optim/adamw_kernels_cuda.cuh — the CUDA twin of adamw_bf16_grad_cpu (adamw_kernels.h):
// the AdamW / Adam update of parameters whose gradient is bfloat16, master, moments and compute
// copy in one pass, many tensors per launch (CUDA build only).
//
// Raw-pointer API, so the .cu compiles without the LibTorch headers. Every product, sum, quotient
// and square root is one IEEE float32 operation rounded to nearest (the __f*_rn intrinsics: no
// multiply-add contraction except the one fused multiply-add of the first moment's lerp, which
// the CPU kernel fuses too), so the result equals the CPU kernel's bit for bit; the copy is the
// updated master rounded to nearest even.
#pragma once

#include <cstdint>

#include "trainer/optim/adamw_step.h"

namespace titan::trainer::optim::kernels {

// One parameter: n elements, all on the launch's device. bf16 values are their 16-bit patterns.
// neg_step_size and bias_correction2_sqrt are per tensor (each keeps its own step count); the
// other scalars come from the launch's AdamWStep.
struct AdamWCudaTensor {
  float* param;
  const uint16_t* grad;
  float* exp_avg;
  float* exp_avg_sq;
  uint16_t* copy;
  int64_t n;
  float neg_step_size;
  float bias_correction2_sqrt;
};

// Updates every tensor in `tensors` (count of them) on `stream` (a cudaStream_t), in as few
// launches as the kernel's parameter space allows.
void launch_adamw_bf16_grad(const AdamWCudaTensor* tensors, int64_t count, const AdamWStep& common,
                            void* stream);

}  // namespace titan::trainer::optim::kernels
