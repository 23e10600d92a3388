#include "trainer/optim/optimizer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace titan::trainer::optim {

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions options)
    : params_(std::move(params)), options_(std::move(options)) {
  TORCH_CHECK(options_.name == "AdamW" || options_.name == "Adam", "optimizer.name '",
              options_.name, "' is not supported (valid: AdamW, Adam)");
  for (const auto& p : params_) {
    TORCH_CHECK(p.scalar_type() == at::kFloat, "the optimizer keeps float32 master parameters; got ",
                p.scalar_type());
    auto f32 = p.options().dtype(at::kFloat);
    exp_avg_.push_back(at::zeros(p.sizes(), f32));
    exp_avg_sq_.push_back(at::zeros(p.sizes(), f32));
    steps_.push_back(at::zeros({}, f32));
  }
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  // Parameters are float32 masters (low-precision compute copies are made by the trainer), so
  // one fused call covers them all.
  std::vector<at::Tensor> p, g, m, v, s;
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& grad = params_[i].grad();
    if (!grad.defined()) continue;
    p.push_back(params_[i]);
    g.push_back(grad);
    m.push_back(exp_avg_[i]);
    v.push_back(exp_avg_sq_[i]);
    s.push_back(steps_[i]);
  }
  if (p.empty()) return;
  // The fused kernel reads the step count for bias correction but does not advance it
  // (torch.optim increments it just before the call, as here).
  at::_foreach_add_(s, 1.0);
  if (options_.name == "AdamW") {
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, s, lr, options_.beta1, options_.beta2,
                      options_.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false);
  } else {
    at::_fused_adam_(p, g, m, v, /*max_exp_avg_sqs=*/{}, s, lr, options_.beta1, options_.beta2,
                     options_.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
}

void AdamW::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    bytes += exp_avg_[i].nbytes() + exp_avg_sq_[i].nbytes() + steps_[i].nbytes();
  return bytes;
}

// torchtitan 0.2.x's linear_warmup_stable_decay (torchtitan/components/lr_scheduler.py, as in
// release v0.2.2), with LambdaLR's 0-based step s = training step - 1:
//   warmup:  (s + 1) / warmup          -> the peak LR on the last warmup step
//   stable:  1                         (stable includes one virtual extra step, see lr_phases)
//   decay:   progress = (s + 1 - warmup - stable) / decay, curve(progress) in [0, 1],
//            then min_lr_factor + (1 - min_lr_factor) * curve
// torchtitan's early releases warmed up with (s + 1) / (warmup + 1), one step slower; the loss
// curves of the two differ from step 2 on, so only the current formula is offered.
double LrSchedule::factor(int64_t step) const {
  const LrPhases phases = lr_phases(training_steps, warmup_steps, decay_ratio);
  const int64_t warmup = phases.warmup, stable = phases.stable, decay_steps = phases.decay;
  const int64_t s = step - 1;
  if (s < warmup) return static_cast<double>(s + 1) / static_cast<double>(warmup);
  if (s < warmup + stable) return 1.0;
  const double progress =
      static_cast<double>(s + 1 - warmup - stable) / static_cast<double>(std::max<int64_t>(decay_steps, 1));
  double curve;
  if (decay_type == "linear") {
    curve = 1.0 - progress;
  } else if (decay_type == "sqrt") {
    curve = 1.0 - std::sqrt(progress);
  } else if (decay_type == "cosine") {
    curve = 0.5 * (1.0 + std::cos(M_PI * progress));
  } else {
    TORCH_CHECK(false, "lr_scheduler.decay_type '", decay_type, "' (valid: linear, sqrt, cosine)");
  }
  return min_lr_factor + (1.0 - min_lr_factor) * curve;
}

}  // namespace titan::trainer::optim
