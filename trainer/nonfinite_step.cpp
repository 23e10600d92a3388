// Note [Non-finite steps]: every step checks the global loss and the gradient norm, two scalars
// the step computes anyway (the loss is summed over the data-parallel ranks, the norm's sum of
// squares is all-reduced over every rank), so the check costs nothing and every rank sees the
// same values: all ranks stop, or skip, at the same step. A NaN/Inf on any rank propagates
// through both sums. Only after a non-finite step is detected is the step's forward + backward
// run again on the same batch with a check of each top-level module's output
// (Transformer::set_output_observer) and of each parameter's gradient, to name where it broke. That
// re-run is collective like the step itself, so the checks record and never throw mid-way (a
// rank that stopped early would leave its peers waiting in a collective). A skipped step makes
// no optimizer update (the gradients are dropped by the next step's zero_grad) and no
// after_optimizer_step: the weights did not change. Nor does what the step recorded for later
// steps (ParallelModel::discard_step_statistics): its MoE token counts are dropped and every
// expert_bias stays as it was, so the next step balances from its own counts alone (the bias
// update runs after this check for that reason; before it, a skipped step moved the biases), and
// a delayed float8 recipe's amaxes of the step are dropped, so a NaN/Inf amax never reaches the
// histories and the next step scales as if the skipped one had not run.
#include <ATen/ops/abs.h>
#include <ATen/ops/isfinite.h>

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "parallel/parallel_model.h"
#include "trainer/train.h"
#include "util/logging.h"

namespace titan::trainer {
namespace {

constexpr int64_t kMaxConsecutiveSkips = 10;  // a run that only skips has diverged for good

bool all_finite(const at::Tensor& t) { return !t.defined() || at::isfinite(t).all().item<bool>(); }

std::string number(double x) {
  std::ostringstream s;
  s.precision(3);
  s << x;
  return s.str();
}

}  // namespace

void Trainer::on_nonfinite_step(int64_t step, const data::Batch& batch, double loss, double grad_norm) {
  const std::string what = "step " + std::to_string(step) + ": loss " + number(loss) + ", grad_norm " + number(grad_norm);
  if (cfg_.training.skip_nonfinite_steps && consecutive_skipped_steps_ + 1 < kMaxConsecutiveSkips) {
    ++skipped_steps_;
    ++consecutive_skipped_steps_;
    util::log_warn(what + ": skipped, no optimizer update (training.skip_nonfinite_steps; " + std::to_string(skipped_steps_) +
                   " skipped so far)");
    return;
  }
  // Where it broke: the same batch again, every module's output and every gradient checked.
  std::string first_output;
  model_->set_output_observer([&](const std::string& fqn, const at::Tensor& out) {
    if (first_output.empty() && !all_finite(out.detach())) first_output = fqn;
  });
  optimizer_->zero_grad();
  try {
    forward_backward(batch);  // the step's own forward + backward and gradient finish
  } catch (...) {
    model_->set_output_observer(nullptr);
    throw;
  }
  model_->set_output_observer(nullptr);
  const auto& names = param_names();
  const auto& masters = master_params();
  std::string first_grad;
  int64_t bad_grads = 0;
  double largest = 0;
  std::string largest_name;
  for (size_t i = masters.size(); i-- > 0;) {  // backward order: the gradient computed first
    if (!all_finite(parallel_->gradient(i))) {
      ++bad_grads;
      if (first_grad.empty()) first_grad = names[i];
    }
    if (masters[i].numel() > 0) {
      const double m = at::abs(masters[i].detach()).max().item<double>();
      if (!(m <= largest)) largest = m, largest_name = names[i];
    }
  }
  std::string msg = what + ": training diverged. ";
  msg += first_output.empty() ? "Every module's forward output is finite on this rank"
                              : "The first module whose forward output is not finite: '" + first_output + "'";
  msg += first_grad.empty() ? "; every gradient on this rank is finite"
                            : "; the first non-finite gradient (backward order): '" + first_grad + "' (" +
                                  std::to_string(bad_grads) + " of " + std::to_string(masters.size()) +
                                  " parameters)";
  if (!largest_name.empty()) msg += "; the largest weight is |x| = " + number(largest) + " in '" + largest_name + "'";
  if (cfg_.training.skip_nonfinite_steps)
    msg += "; " + std::to_string(kMaxConsecutiveSkips) + " steps in a row were non-finite";
  msg += ". optimizer.lr is " + number(cfg_.optimizer.lr) + ": lower it (e.g. to " + number(cfg_.optimizer.lr / 10) +
         ") or lengthen lr_scheduler.warmup_steps";
  if (!cfg_.training.skip_nonfinite_steps) msg += "; training.skip_nonfinite_steps = true skips such steps instead";
  throw std::runtime_error(msg);
}

}  // namespace titan::trainer
