// model/linear_autograd.h — the one autograd Function every linear compute runs through (its
// code in model/linear.cpp).
//
// Note [One linear skeleton]: y = x W^T for input [..., K] and weight [N, K], whatever the
// arithmetic (high precision, float8, block-scaled, int8). The skeleton owns what must be the same
// for all of them, so no compute can differ in it:
//   forward:  the output product through the op layer as "mm" (model/activation_checkpoint_ops.h),
//             so per-op selective AC keeps every linear's product under the same policy (See Note
//             [Replay needs no autograd history]) — except where the arithmetic records state as
//             the product runs (float8's delayed scaling: amax histories and the scales backward
//             re-casts with), which a replay would skip, so it always runs; x and W saved for
//             backward; the [M, N] product viewed back as [..., N];
//   backward: G = the output gradient as [M, N]; grad_input (reshaped to x's shape) and
//             grad_weight [N, K] each computed only when autograd needs it; no gradient for the
//             arithmetic argument.
// A LinearArithmetic says how the products are computed. It is held by the autograd graph
// until backward (a reference count), so it may carry what one call's backward needs (operands
// its producer cast, a delayed recipe's scale snapshot) and outlives a set_compute() swap.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace titan::model {

class LinearArithmetic : public torch::CustomClassHolder {
 public:
  // The product [M, N] of input [..., K] (flattened by the arithmetic, which may cast first) and
  // weight [N, K]. Inside the op layer unless records_state(): it must then record nothing that
  // backward reads, because a replay returns the kept product without running it.
  virtual at::Tensor output(const at::Tensor& input, const at::Tensor& weight) = 0;
  // Whether output() changes state backward or a later step reads (it then runs every time).
  virtual bool records_state() const { return false; }
  struct Grads {
    at::Tensor input;   // [M, K] (or any shape of x's numel), undefined when not asked for
    at::Tensor weight;  // [N, K]; undefined when not asked for, or when delivered otherwise
  };
  // grad [M, N]; input and weight as the forward saved them.
  virtual Grads backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                         bool need_input, bool need_weight) = 0;
};

// y [..., N] = input [..., K] W^T through the skeleton, with `arithmetic`'s products.
at::Tensor apply_linear(const at::Tensor& input, const at::Tensor& weight,
                        const c10::intrusive_ptr<LinearArithmetic>& arithmetic);

}  // namespace titan::model
