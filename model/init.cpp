// model/init.cpp — Transformer::init_weights: each parameter drawn from its family's
// distribution (Family::init_spec) by the counter-based generator (See Note [Counter-based init]
// in model/init_philox.h), so any shard of any parameter can be filled on its own.
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "model/transformer.h"
#include "model/param_path.h"

namespace titan::model {

InitSpec Transformer::init_spec(const std::string& fqn) const { return family_->init_spec(args_, fqn); }

void Transformer::init_weights(uint64_t seed) {
  at::NoGradGuard no_grad;
  visit_params([&](const std::string& fqn, at::Tensor& p) {
    const std::vector<int64_t> origin(static_cast<size_t>(p.dim()), 0);
    fill_init_box(p, init_spec(fqn), seed, fqn, p.sizes(), origin);
  });
}

}  // namespace titan::model
