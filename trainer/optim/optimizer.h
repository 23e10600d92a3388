// trainer/optim/optimizer.h — AdamW (and Adam) over a flat list of parameters, plus gradient clipping.
//
// The step is ATen's fused multi-tensor kernel (`_fused_adamw_` / `_fused_adam_`), which computes
// exactly torch.optim.AdamW(fused=True): one pass over each parameter, state in float32.
// Parameters may be local shards (FSDP); the optimizer never needs the full model.
#pragma once

#include <ATen/core/Tensor.h>

#include "trainer/optim/adamw_step.h"
#include "trainer/optim/lr_schedule.h"

#include <string>
#include <vector>

namespace titan::trainer::optim {

struct AdamWOptions {
  std::string name = "AdamW";  // "AdamW" (decoupled weight decay) or "Adam" (L2 in the gradient)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

class AdamW {
 public:
  // `compute_copies` (empty, or one per parameter, undefined where there is none): the bf16
  // leaves the model reads for those parameters. Their gradients are the parameters' gradients,
  // and each step rewrites them from the updated parameters (See Note [Optimizer over compute
  // copies] in trainer/optim/adamw_kernels.h).
  AdamW(std::vector<at::Tensor> params, AdamWOptions options, std::vector<at::Tensor> compute_copies = {});

  // Parameters without a gradient are skipped. `copy_grad_scale` multiplies the gradients read
  // from compute copies (the clipping factor, which a float32 gradient already received in place).
  void step(double lr, double copy_grad_scale = 1.0);
  void zero_grad();      // drops the gradients (frees their memory until the next backward)

  const std::vector<at::Tensor>& params() const { return params_; }
  int64_t state_bytes() const;  // exp_avg + exp_avg_sq (+ step counters)

  // The state of parameter i, for checkpoints: the moments have the parameter's shape (and its
  // shard layout); the step count is a float32 scalar (what the fused kernel reads). A load
  // copies into these tensors in place.
  const at::Tensor& exp_avg(size_t i) const { return exp_avg_.at(i); }
  const at::Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_.at(i); }
  const at::Tensor& step_count(size_t i) const { return steps_.at(i); }
  const AdamWOptions& options() const { return options_; }

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> copies_;      // per param: its bf16 compute copy, or undefined
  std::vector<at::Tensor> exp_avg_;     // per param, same shape, float32
  std::vector<at::Tensor> exp_avg_sq_;  // per param, same shape, float32
  std::vector<at::Tensor> steps_;       // per param, scalar float32 (the fused kernel's layout)
  AdamWOptions options_;

  // ATen's fused kernel over parameters with float32 gradients (step counts already advanced).
  void fused_step(const std::vector<at::Tensor>& p, const std::vector<at::Tensor>& g, const std::vector<at::Tensor>& m,
                  const std::vector<at::Tensor>& v, const std::vector<at::Tensor>& s, double lr) const;
  // The parameters `which` through their compute copies' bf16 gradients (See Note [Optimizer over
  // compute copies]): titan's CPU kernel one tensor at a time, or its CUDA kernel over all of them.
  void step_through_copies(const std::vector<size_t>& which, double lr, double grad_scale);
  // The kernels' scalars for step count t (ATen's: formed in double, then float32).
  kernels::AdamWStep step_scalars(double lr, double t, double grad_scale) const;
};

// LR multiplier of torchtitan's warmup-stable-decay schedule for optimizer step `step`
// (1-based training step). See LrSchedule::factor in optimizer.cpp for the exact formula and
// lr_schedule.h for the phase lengths (warmup clamped to training_steps, as torchtitan does).
struct LrSchedule {
  int64_t training_steps;
  int64_t warmup_steps;
  double decay_ratio;  // < 0: decay over every step after warmup
  std::string decay_type;  // linear | sqrt | cosine
  double min_lr_factor;
  double factor(int64_t step) const;
};

}  // namespace titan::trainer::optim
