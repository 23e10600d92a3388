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

#ifdef TITAN_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "trainer/optim/adamw_kernels_cuda.cuh"
#endif

namespace titan::trainer::optim {
namespace {
#ifdef TITAN_WITH_CUDA
constexpr bool kCudaKernel = true;  // adamw_kernels_cuda.cu
#else
constexpr bool kCudaKernel = false;  // no CUDA tensors in this build
#endif
}  // namespace

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
  // kernel, on the CPU or on CUDA (See Note [Optimizer over compute copies]).
  // On a CPU without AVX2 a compute copy's gradient is widened and joins the one fused call, and
  // the copies are rewritten together after it.
  std::vector<size_t> through_copies;
  std::vector<at::Tensor> p, g, m, v, s, widened_copies, widened_params;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor grad = params_[i].grad();
    if (copies_[i].defined() && copies_[i].grad().defined()) {
      if (params_[i].is_contiguous() && (params_[i].is_cuda() ? kCudaKernel : kernels::adamw_cpu_kernel_available())) {
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
  step_through_copies(through_copies, lr, copy_grad_scale);
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

kernels::AdamWStep AdamW::step_scalars(double lr, double t, double grad_scale) const {
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
  return k;
}

void AdamW::step_through_copies(const std::vector<size_t>& which, double lr, double grad_scale) {
  std::vector<size_t> on_cuda;
  for (size_t i : which) {
    if (params_[i].is_cuda()) {
      on_cuda.push_back(i);
      continue;
    }
    at::Tensor& param = params_[i];
    at::Tensor& copy = copies_[i];
    const at::Tensor grad = copy.grad().contiguous();
    steps_[i].add_(1.0);
    const kernels::AdamWStep k = step_scalars(lr, steps_[i].item<float>(), grad_scale);
    kernels::adamw_bf16_grad_cpu(param.data_ptr<float>(), grad.data_ptr<c10::BFloat16>(), exp_avg_[i].data_ptr<float>(),
                                 exp_avg_sq_[i].data_ptr<float>(), copy.data_ptr<c10::BFloat16>(), param.numel(), k);
  }
  if (on_cuda.empty()) return;
#ifdef TITAN_WITH_CUDA
  // Every step count in one read (one synchronization per step, not one per tensor).
  std::vector<at::Tensor> counts, grads;
  for (size_t i : on_cuda) counts.push_back(steps_[i]);
  at::_foreach_add_(counts, 1.0);
  const at::Tensor t_host = at::stack(counts).cpu();
  std::vector<kernels::AdamWCudaTensor> tensors;
  for (size_t j = 0; j < on_cuda.size(); ++j) {
    const size_t i = on_cuda[j];
    TORCH_CHECK(params_[i].device() == params_[on_cuda[0]].device(), "AdamW: compute copies on two CUDA devices");
    grads.push_back(copies_[i].grad().contiguous());  // kept alive until the launch is queued
    const kernels::AdamWStep k = step_scalars(lr, t_host[static_cast<int64_t>(j)].item<float>(), grad_scale);
    tensors.push_back({params_[i].data_ptr<float>(), reinterpret_cast<const uint16_t*>(grads.back().data_ptr()),
                       exp_avg_[i].data_ptr<float>(), exp_avg_sq_[i].data_ptr<float>(),
                       reinterpret_cast<uint16_t*>(copies_[i].data_ptr()), params_[i].numel(), k.neg_step_size,
                       k.bias_correction2_sqrt});
  }
  const c10::cuda::CUDAGuard guard(params_[on_cuda[0]].device());
  kernels::launch_adamw_bf16_grad(tensors.data(), static_cast<int64_t>(tensors.size()),
                                  step_scalars(lr, 1.0, grad_scale),
                                  c10::cuda::getCurrentCUDAStream(params_[on_cuda[0]].device().index()).stream());
#endif
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
