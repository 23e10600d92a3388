// model/layers.cpp — see layers.h.
#include "model/layers.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <vector>

#include "model/kernels/fused_ops.h"

namespace titan::model {

at::Tensor meta_tensor(at::IntArrayRef shape) {
  return at::empty(shape, at::TensorOptions().device(c10::kMeta).dtype(at::kFloat));
}

void make_linear_meta(Linear& linear) {
  linear.weight = meta_tensor({linear.out_features(), linear.in_features()});
}

// ---------------------------------------------------------------- RMSNorm

RMSNorm::RMSNorm(std::string fqn_, int64_t dim, double eps_)
    : fqn(std::move(fqn_)), eps(eps_), weight(meta_tensor({dim})) {}

namespace {

// torch.finfo(dtype).eps: what an nn.RMSNorm built without eps uses.
double dtype_epsilon(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return std::numeric_limits<double>::epsilon();
    case at::kBFloat16: return 0.0078125;          // 2^-7
    case at::kHalf: return 0.0009765625;           // 2^-10
    default: return std::numeric_limits<float>::epsilon();  // 2^-23
  }
}

}  // namespace

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  // torchtitan's nn.RMSNorm (F.rms_norm): normalized and scaled in float32 whatever the compute
  // dtype, one rounding to it at the end; bf16 activations with bf16 weights (the compute copies)
  // run the fused kernel's bf16 form, which is exactly that (model/kernels/fused_ops.h); float64
  // and mixed dtypes run ATen's composite, which promotes the same way.
  return fused_rms_norm(x, weight, eps < 0 ? dtype_epsilon(x.scalar_type()) : eps);
}

void RMSNorm::visit_params(const ParamVisitor& visit) { visit(fqn + ".weight", weight); }

// ---------------------------------------------------------------- RoPE

RotaryTable make_rotary_table(int64_t head_dim, int64_t max_seq_len, double theta,
                              c10::Device device, const RopeScaling& scaling) {
  TORCH_CHECK(head_dim % 2 == 0, "RoPE needs an even head_dim, got ", head_dim);
  // freqs[i] = theta^(-2i / head_dim), then Llama 3.1's scaling (head_dim / 2 scalars, so a
  // plain loop); angles computed in float64 then stored as float32.
  std::vector<double> scaled(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    scaled[i] = scaling.scale(1.0 / std::pow(theta, 2.0 * i / static_cast<double>(head_dim)));
  }
  return make_rotary_table(scaled, max_seq_len, device);
}

RotaryTable make_rotary_table(const std::vector<double>& frequencies, int64_t max_seq_len, c10::Device device) {
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor freqs = at::tensor(frequencies, f64);
  at::Tensor angles = at::outer(at::arange(max_seq_len, f64), freqs);
  return {angles.cos().to(at::kFloat).to(device), angles.sin().to(at::kFloat).to(device)};
}

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTable& table) {
  const int64_t seq_len = x.size(1);
  TORCH_CHECK(seq_len <= table.cos.size(0), "sequence length ", seq_len,
              " exceeds the RoPE table (", table.cos.size(0), " positions)");
  // One fused pass for float32 (bit-identical to the composite, which runs for other dtypes).
  return fused_rotary(x, table.cos, table.sin);
}

at::Tensor apply_rotary_half(const at::Tensor& x, const RotaryTable& table) {
  const int64_t seq_len = x.size(1), half = x.size(3) / 2;
  TORCH_CHECK(seq_len <= table.cos.size(0), "sequence length ", seq_len,
              " exceeds the RoPE table (", table.cos.size(0), " positions)");
  // [S, hd/2] -> [1, S, 1, hd/2]: every batch row and head; in the activations' dtype, as
  // torchtitan's Qwen3 casts its cache.
  const at::Tensor cos = table.cos.narrow(0, 0, seq_len).view({1, seq_len, 1, half}).to(x.scalar_type());
  const at::Tensor sin = table.sin.narrow(0, 0, seq_len).view({1, seq_len, 1, half}).to(x.scalar_type());
  const at::Tensor x1 = x.narrow(3, 0, half), x2 = x.narrow(3, half, half);
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, 3);
}

// ---------------------------------------------------------------- FeedForward

FeedForward::FeedForward(const std::string& prefix, int64_t dim, int64_t hidden_dim)
    : prefix(prefix),
      w1(prefix + ".w1", dim, hidden_dim),
      w2(prefix + ".w2", hidden_dim, dim),
      w3(prefix + ".w3", dim, hidden_dim) {
  for (Linear* l : {&w1, &w2, &w3}) make_linear_meta(*l);
}

at::Tensor FeedForward::forward(const at::Tensor& x_in) const {
  const LinearOperand x = prepare_input ? prepare_input(x_in) : LinearOperand(x_in);
  // w1 before w3, explicitly: per-op AC counts matrix products in call order (every second one
  // is recomputed), so the order must not be left to unspecified argument evaluation.
  at::Tensor gate = w1.forward(x);  // [B, S, hidden]
  at::Tensor up = w3.forward(x);    // [B, S, hidden]
  return w2.forward(fused_swiglu(gate, up));  // silu(gate) * up, one pass
}

void FeedForward::visit_params(const ParamVisitor& visit) {
  for (Linear* l : linears()) visit(l->fqn() + ".weight", l->weight);
}

std::vector<Linear*> FeedForward::linears() { return {&w1, &w2, &w3}; }

std::vector<TpRule> FeedForward::tp_plan() const {
  return {{prefix, TpStyle::kGatherInput, {w1.fqn(), w3.fqn()}},
          {w1.fqn(), TpStyle::kColwise},
          {w2.fqn(), TpStyle::kRowwise},
          {w3.fqn(), TpStyle::kColwise}};
}

}  // namespace titan::model
