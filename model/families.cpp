// model/families.cpp — the registry: every family titan trains, one line each. Adding a family
// is its folder (model/<family>/) and its line here (See Note [A family is a declaration]).
#include "model/family.h"
#include "model/layers.h"
#include "model/moe/experts.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace titan::model {

namespace llama3 { const Family& family(); }  // model/llama3/family.cpp
namespace qwen3 { const Family& family(); }   // model/qwen3/family.cpp
namespace deepseek_v3 { const Family& family(); }  // model/deepseek_v3/family.cpp
namespace llama4 { const Family& family(); }  // model/llama4/family.cpp
namespace gpt_oss { const Family& family(); }  // model/gpt_oss/family.cpp

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> all = {&llama3::family(), &qwen3::family(), &deepseek_v3::family(),
                                                   &llama4::family(), &gpt_oss::family()};
  return all;
}

const Family& family(const std::string& name) {
  std::string valid;
  for (const Family* f : families()) {
    if (f->name() == name) return *f;
    valid += (valid.empty() ? "" : ", ") + f->name();
  }
  throw std::invalid_argument("model.name '" + name + "' is not a model family titan trains (valid: " + valid + ")");
}

FeedForwardKind Family::feed_forward(const ModelArgs& args, int64_t) const {
  return args.moe ? FeedForwardKind::kMoE : FeedForwardKind::kDense;
}

std::unique_ptr<moe::RoutedExperts> Family::make_experts(const std::string&, const ModelArgs&, int64_t) const {
  return nullptr;  // the MoE layer's own SwiGLU experts
}

int64_t Family::routed_expert_params(const ModelArgs& args) const {
  return FeedForward::param_count(args.dim, args.moe_hidden_dim);  // one SwiGLU of moe_hidden_dim
}

int64_t Family::routed_expert_saved_per_row(const ModelArgs& args) const { return 4 * args.moe_hidden_dim; }

std::vector<double> Family::rope_frequencies(const ModelArgs& args) const {
  const int64_t head_dim = args.head_dim();
  if (head_dim % 2 != 0) throw std::invalid_argument("RoPE needs an even head_dim, got " + std::to_string(head_dim));
  std::vector<double> freqs(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i)
    freqs[static_cast<size_t>(i)] =
        args.rope_scaling.scale(1.0 / std::pow(args.rope_theta, 2.0 * i / static_cast<double>(head_dim)));
  return freqs;
}

}  // namespace titan::model
