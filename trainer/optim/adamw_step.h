// trainer/optim/adamw_step.h — the scalars of one AdamW (or Adam) update as titan's kernels take
// them, formed on the host in double and rounded to float32 as ATen's fused kernel forms them.
// No LibTorch here: the CUDA kernel (adamw_kernels_cuda.cu) and the CPU kernel share it.
#pragma once

namespace titan::trainer::optim::kernels {

struct AdamWStep {
  float lr_decay = 1;      // AdamW: 1 - lr * weight_decay (1 for Adam)
  float grad_decay = 0;    // Adam: weight_decay, added to the gradient as p * wd (0 for AdamW)
  float beta1_weight = 0;  // 1 - beta1, the lerp weight of the first moment
  float beta2 = 0;
  float beta2_weight = 0;  // 1 - beta2
  float bias_correction2_sqrt = 1;
  float eps = 0;
  float neg_step_size = 0;  // -lr / (1 - beta1^t)
  float grad_scale = 1;     // the clipping factor (1: none)
};

}  // namespace titan::trainer::optim::kernels
