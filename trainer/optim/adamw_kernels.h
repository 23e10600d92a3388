// trainer/optim/adamw_kernels.h — the AdamW (and Adam) update of one parameter whose gradient is
// bfloat16, in one pass: the float32 master, its two float32 moments and its bfloat16 compute copy.
//
// Note [Optimizer over compute copies]: under bf16 compute a parameter that no collective sums
// and that one backward per step reaches is read by the model as a bf16 leaf (its compute copy);
// its gradient stays bf16, exactly what a cast's backward would have widened to float32
// (bf16 -> float32 is exact). The update reads it as float32 here, scales it by the clipping
// factor in float32 (what clipping does in place to a float32 gradient), and writes the copy
// from the updated master (round to nearest even) in the same pass: no conversion of the
// gradient, no separate cast of the masters. The arithmetic is ATen's fused AdamW kernel's
// float32 path, operation for operation: decay p * (1 - lr wd) (Adam: g + p wd), m by lerp (one
// fused multiply-add), v * b2 + ((1 - b2) g) g, denominator sqrt(v) / sqrt(1 - b2^t) + eps,
// p + (-lr / (1 - b1^t)) m / denominator; elementwise, so the thread count changes nothing.
// On CUDA the same operations run in one kernel over all such parameters
// (adamw_kernels_cuda.cuh), equal to this kernel bit for bit: on an H200 it replaced a widening
// pass, a scaling pass, ATen's fused AdamW and a copy pass (about 50 ms of the 8B_4layers step)
// with one pass at 3.9 TB/s (13.6 ms).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

#include "trainer/optim/adamw_step.h"

namespace titan::trainer::optim::kernels {

// Whether the CPU kernel below runs on this machine (x86: AVX2 + FMA; see
// util::cpu_has_avx2_kernels); otherwise callers widen the gradient and use ATen's kernel.
bool adamw_cpu_kernel_available();

// n elements: param, exp_avg, exp_avg_sq updated in place, copy = bf16(param after the step).
void adamw_bf16_grad_cpu(float* param, const c10::BFloat16* grad, float* exp_avg, float* exp_avg_sq,
                         c10::BFloat16* copy, int64_t n, const AdamWStep& s);

}  // namespace titan::trainer::optim::kernels
