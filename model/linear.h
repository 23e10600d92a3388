// model/linear.h — the one way the model creates a linear layer.
//
// Every projection in Llama (wq, wk, wv, wo, w1, w2, w3, output) is a `Linear` that owns its
// weight and delegates the product to a swappable `LinearCompute`. float8/ and parallel/ convert
// or wrap linears by fully-qualified name by installing another compute object; the weight
// tensor (and therefore optimizer state, FSDP sharding, checkpoint names) never changes hands.
// This is the C++ counterpart of torchao's `convert_to_float8_training` and torchtitan's
// `parallelize_module`, without replacing modules.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

namespace titan::model {

// y = x W^T for x [..., in_features] and W [out_features, in_features]; no bias (Llama has none).
class LinearCompute {
 public:
  virtual ~LinearCompute() = default;
  virtual at::Tensor forward(const at::Tensor& input, const at::Tensor& weight) = 0;
  // Short name for logs, e.g. "hp", "float8[rowwise]", "int8", "colwise(float8[rowwise])".
  virtual std::string describe() const = 0;
};

// The high-precision product x W^T (an autograd Function whose GEMM goes through the op layer,
// model/checkpoint_ops.h): the default compute of every Linear.
class HighPrecisionLinearCompute final : public LinearCompute {
 public:
  at::Tensor forward(const at::Tensor& input, const at::Tensor& weight) override;
  std::string describe() const override { return "hp"; }
};

class Linear {
 public:
  Linear(std::string fqn, int64_t in_features, int64_t out_features);

  at::Tensor forward(const at::Tensor& input) const { return compute_->forward(input, weight); }

  const std::string& fqn() const { return fqn_; }  // e.g. "layers.0.attention.wq"
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

  void set_compute(std::shared_ptr<LinearCompute> compute);
  const std::shared_ptr<LinearCompute>& compute() const { return compute_; }

  at::Tensor weight;  // [out_features, in_features], parameter "<fqn>.weight"

 private:
  std::string fqn_;
  int64_t in_features_;
  int64_t out_features_;
  std::shared_ptr<LinearCompute> compute_;
};

}  // namespace titan::model
