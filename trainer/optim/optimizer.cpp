#include "trainer/optim/optimizer.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <cmath>

#include "trainer/optim/adamw_kernels.h"

namespace titan::trainer::optim {

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions options, std::vector<at::Tensor> compute_copies)
    : params_(std::move(params)), copies_(std::move(compute_copies)), options_(std::move(options)) {
  TORCH_CHECK(options_.name == "AdamW" || options_.name == "Adam", "optimizer.name '",
              options_.name, "' is not supported (valid: AdamW, Adam)");
  if (copies_.empty()) copies_.resize(params_.size());
  TORCH_CHECK(copies_.size() == params_.size(), "AdamW: ", copies_.size(), " compute copies for ", params_.size(),
              " parameters");
  for (size_t i = 0; i < copies_.size(); ++i)
    TORCH_CHECK(!copies_[i].defined() || (copies_[i].scalar_type() == at::kBFloat16 &&
                                          copies_[i].sizes() == params_[i].sizes() && copies_[i].is_contiguous()),
                "AdamW: a compute copy must be a contiguous bfloat16 tensor of its parameter's shape");
  for (const auto& p : params_) {
    TORCH_CHECK(p.scalar_type() == at::kFloat, "the optimizer keeps float32 master parameters; got ",
                p.scalar_type());
    auto f32 = p.options().dtype(at::kFloat);
    exp_avg_.push_back(at::zeros(p.sizes(), f32));
    exp_avg_sq_.push_back(at::zeros(p.sizes(), f32));
    steps_.push_back(at::zeros({}, f32));
  }
}

void AdamW::step(double lr, double copy_grad_scale) {
  at::NoGradGuard no_grad;
  // Parameters are float32 masters: one fused ATen call covers those with a float32 gradient;
  // those read through a bf16 compute copy are updated (and their copy rewritten) by titan's
  // kernel (See Note [Optimizer over compute copies]).
  // On a GPU (or a CPU without AVX2) a compute copy's gradient is widened and joins the one
  // fused call, and the copies are rewritten together after it.
  std::vector<size_t> through_copies;
  std::vector<at::Tensor> p, g, m, v, s, widened_copies, widened_params;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor grad = params_[i].grad();
    if (copies_[i].defined() && copies_[i].grad().defined()) {
      if (params_[i].is_cpu() && params_[i].is_contiguous() && kernels::adamw_cpu_kernel_available()) {
        through_copies.push_back(i);
        continue;
      }
      grad = copies_[i].grad().to(at::kFloat);
      if (copy_grad_scale != 1.0) grad.mul_(copy_grad_scale);
      widened_copies.push_back(copies_[i]);
      widened_params.push_back(params_[i]);
    }
    if (!grad.defined()) continue;
    p.push_back(params_[i]);
    g.push_back(grad);
    m.push_back(exp_avg_[i]);
    v.push_back(exp_avg_sq_[i]);
    s.push_back(steps_[i]);
  }
  for (size_t i : through_copies) step_through_copy(i, lr, copy_grad_scale);
  if (p.empty()) return;
  // The fused kernel reads the step count for bias correction but does not advance it
  // (torch.optim increments it just before the call, as here).
  at::_foreach_add_(s, 1.0);
  fused_step(p, g, m, v, s, lr);
  if (!widened_copies.empty()) at::_foreach_copy_(widened_copies, widened_params);
}

void AdamW::fused_step(const std::vector<at::Tensor>& p, const std::vector<at::Tensor>& g,
                       const std::vector<at::Tensor>& m, const std::vector<at::Tensor>& v,
                       const std::vector<at::Tensor>& s, double lr) const {
  if (options_.name == "AdamW") {
    at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, s, lr, options_.beta1, options_.beta2,
                      options_.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false);
  } else {
    at::_fused_adam_(p, g, m, v, /*max_exp_avg_sqs=*/{}, s, lr, options_.beta1, options_.beta2,
                     options_.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
}

void AdamW::step_through_copy(size_t i, double lr, double grad_scale) {
  at::Tensor& param = params_[i];
  at::Tensor& copy = copies_[i];
  const at::Tensor grad = copy.grad().contiguous();
  steps_[i].add_(1.0);
  // The scalars as ATen's kernel forms them: in double, then float32.
  const double t = steps_[i].item<float>();
  const bool decoupled = options_.name == "AdamW";
  kernels::AdamWStep k;
  k.lr_decay = decoupled ? static_cast<float>(1 - lr * options_.weight_decay) : 1.f;
  k.grad_decay = decoupled ? 0.f : static_cast<float>(options_.weight_decay);
  k.beta1_weight = static_cast<float>(1 - options_.beta1);
  k.beta2 = static_cast<float>(options_.beta2);
  k.beta2_weight = static_cast<float>(1 - options_.beta2);
  k.bias_correction2_sqrt = static_cast<float>(std::sqrt(1 - std::pow(options_.beta2, t)));
  k.eps = static_cast<float>(options_.eps);
  k.neg_step_size = static_cast<float>(-(lr / (1 - std::pow(options_.beta1, t))));
  k.grad_scale = static_cast<float>(grad_scale);
  kernels::adamw_bf16_grad_cpu(param.data_ptr<float>(), grad.data_ptr<c10::BFloat16>(), exp_avg_[i].data_ptr<float>(),
                               exp_avg_sq_[i].data_ptr<float>(), copy.data_ptr<c10::BFloat16>(), param.numel(), k);
}

void AdamW::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
  for (auto& c : copies_)
    if (c.defined()) c.mutable_grad() = at::Tensor();
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
