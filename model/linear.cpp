#include "model/linear.h"

#include <ATen/ops/linear.h>
#include <c10/util/Exception.h>

namespace titan::model {

at::Tensor HighPrecisionLinearCompute::forward(const at::Tensor& input, const at::Tensor& weight) {
  return at::linear(input, weight);
}

Linear::Linear(std::string fqn, int64_t in_features, int64_t out_features)
    : fqn_(std::move(fqn)),
      in_features_(in_features),
      out_features_(out_features),
      compute_(std::make_shared<HighPrecisionLinearCompute>()) {}

void Linear::set_compute(std::shared_ptr<LinearCompute> compute) {
  TORCH_CHECK(compute, "Linear ", fqn_, ": set_compute needs a non-null LinearCompute");
  compute_ = std::move(compute);
}

}  // namespace titan::model
