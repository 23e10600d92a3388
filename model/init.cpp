// Weight initialization of Llama: torchtitan's llama3 scheme (truncated normal, depth-scaled std).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>

#include <cmath>

#include "model/llama.h"

namespace titan::model {
namespace {

// Truncated normal by inverse CDF, the same method as torch.nn.init.trunc_normal_:
// uniform in [cdf(a), cdf(b)], then erfinv. `a` and `b` are absolute bounds.
void trunc_normal_(at::Tensor& t, double std, double a, double b, at::Generator& gen) {
  auto cdf = [](double x) { return (1.0 + std::erf(x / std::sqrt(2.0))) / 2.0; };
  const double lo = cdf(a / std), hi = cdf(b / std);
  t.uniform_(2 * lo - 1, 2 * hi - 1, gen);
  t.erfinv_();
  t.mul_(std * std::sqrt(2.0));
  t.clamp_(a, b);
}

}  // namespace

void Llama::init_weights(uint64_t seed) {
  init_weights(seed, [](const std::string&, at::Tensor& slot, const at::Tensor& full) {
    slot.copy_(full);
  });
}

void Llama::init_weights(uint64_t seed, const InitSink& sink) {
  at::NoGradGuard no_grad;
  // Values are drawn on the CPU in float32, in parameter order, from one generator: the same
  // seed gives the same weights on every device and dtype.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto cpu_f32 = at::TensorOptions().dtype(at::kFloat);
  visit_params([&](const std::string& fqn, at::Tensor& p) {
    at::Tensor values = at::empty(p.sizes(), cpu_f32);
    const auto ends_with = [&](const char* suffix) {
      const std::string s(suffix);
      return fqn.size() >= s.size() && fqn.compare(fqn.size() - s.size(), s.size(), s) == 0;
    };
    if (fqn == "tok_embeddings.weight") {
      values.normal_(0.0, 1.0, gen);
    } else if (fqn == "output.weight") {
      const double std = 1.0 / std::sqrt(static_cast<double>(args_.dim));
      trunc_normal_(values, std, -3 * std, 3 * std, gen);
    } else if (ends_with("norm.weight")) {
      values.fill_(1.0);
    } else {
      // "layers.<id>.<module>.<name>.weight"
      const int64_t layer_id = std::stoll(fqn.substr(7, fqn.find('.', 7) - 7));
      const double depth_std =
          0.02 / std::sqrt(2.0 * (args_.depth_init ? layer_id + 1 : args_.n_layers));
      const bool depth_scaled = ends_with("wo.weight") || ends_with("w2.weight") ||
                                ends_with("w3.weight");
      trunc_normal_(values, depth_scaled ? depth_std : 0.02, -2.0, 2.0, gen);
    }
    sink(fqn, p, values);
  });
}

}  // namespace titan::model
