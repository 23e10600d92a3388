// The tensor-level entry points of model/kernels/attention.h: shape checks, output allocation,
// the operands' strides handed to the raw kernels.
#include "model/kernels/attention.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "model/kernels/fused_ops.h"
#include "util/cpu_features.h"

namespace titan::model {

namespace {

using kernels::AttentionDims;
using kernels::RowStrides;

// The operand's [B, heads, S, hd] strides; a copy first if its last dim is not contiguous.
at::Tensor rows_contiguous(const at::Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); }
RowStrides strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

AttentionDims dims_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                      std::optional<double> scale, int64_t window, int64_t key_offset) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && v.sizes().slice(0, 3) == k.sizes().slice(0, 3) &&
                  q.size(0) == k.size(0) && q.size(3) == k.size(3),
              "cpu attention: q [B, H, Sq, qk_hd], k [B, KV, Sk, qk_hd], v [B, KV, Sk, v_hd] expected, got ", q.sizes(),
              ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "cpu attention: ", q.size(1),
              " query heads are not a multiple of ", k.size(1), " kv heads");
  TORCH_CHECK(window >= 0, "cpu attention: the window must be >= 0 keys (0: none), got ", window);
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16,
              "cpu attention: bfloat16 operands expected, got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
              v.scalar_type());
  return {q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3), causal,
          static_cast<float>(attention_softmax_scale(q.size(3), scale)), window, key_offset};
}

const at::BFloat16* bf16(const at::Tensor& t) { return t.const_data_ptr<at::BFloat16>(); }

}  // namespace

double attention_softmax_scale(int64_t qk_head_dim, std::optional<double> scale) {
  // The expression of LibTorch's sdp::calculate_scale, so an unset scale is the same double here
  // as in its kernels.
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(qk_head_dim));
}

bool cpu_attention_kernel_runs(at::ScalarType dtype) {
  return dtype == at::kBFloat16 && fused_ops_enabled() && util::cpu_has_avx2_kernels();
}

bool cpu_attention_kernel_applies(at::ScalarType dtype, int64_t qk_head_dim, int64_t v_head_dim, int64_t kv_len) {
  return cpu_attention_kernel_runs(dtype) &&
         (kv_len <= kCpuAttentionMaxKeys ||
          kernels::default_attention_products(qk_head_dim, v_head_dim) == kernels::AttentionProducts::kBf16Dot);
}

bool cpu_attention_kernel_applies(const at::Tensor& q, const at::Tensor& v) {
  return q.device().is_cpu() && cpu_attention_kernel_applies(q.scalar_type(), q.size(-1), v.size(-1), v.size(2));
}

std::tuple<at::Tensor, at::Tensor> cpu_attention_forward(const at::Tensor& q_in, const at::Tensor& k_in,
                                                         const at::Tensor& v_in, bool causal,
                                                         std::optional<double> scale, int64_t window,
                                                         int64_t key_offset,
                                                         std::optional<kernels::AttentionProducts> products) {
  const AttentionDims d = dims_of(q_in, k_in, v_in, causal, scale, window, key_offset);
  const at::Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  at::Tensor out = at::empty({d.batch, d.heads, d.q_len, d.v_head_dim}, q.options());
  at::Tensor lse = at::empty({d.batch, d.heads, d.q_len}, q.options().dtype(at::kFloat));
  kernels::attention_forward_cpu(d, bf16(q), strides_of(q), bf16(k), strides_of(k), bf16(v), strides_of(v),
                                 out.mutable_data_ptr<at::BFloat16>(), lse.mutable_data_ptr<float>(),
                                 products.value_or(kernels::default_attention_products(d.qk_head_dim, d.v_head_dim)));
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cpu_attention_backward(
    const at::Tensor& grad_out_in, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const at::Tensor& lse_in, bool causal, at::ScalarType grad_dtype,
    std::optional<double> scale, int64_t window, int64_t key_offset,
    std::optional<kernels::AttentionProducts> products) {
  const AttentionDims d = dims_of(q_in, k_in, v_in, causal, scale, window, key_offset);
  const std::vector<int64_t> out_shape = {d.batch, d.heads, d.q_len, d.v_head_dim};
  TORCH_CHECK(grad_out_in.sizes() == out_shape && out_in.sizes() == out_shape,
              "cpu attention backward: grad_out and out must be [B, H, Sq, v_hd] ", at::IntArrayRef(out_shape),
              ", got ", grad_out_in.sizes(), " and ", out_in.sizes());
  TORCH_CHECK(lse_in.dim() == 3 && lse_in.size(0) == d.batch && lse_in.size(1) == d.heads && lse_in.size(2) == d.q_len,
              "cpu attention backward: lse [B, H, Sq] expected, got ", lse_in.sizes());
  TORCH_CHECK(grad_dtype == at::kBFloat16 || grad_dtype == at::kFloat,
              "cpu attention backward: gradients in bfloat16 or float32, not ", grad_dtype);
  const at::Tensor q = rows_contiguous(q_in), k = rows_contiguous(k_in), v = rows_contiguous(v_in);
  const at::Tensor grad_out = rows_contiguous(grad_out_in.to(at::kBFloat16));
  const at::Tensor out = rows_contiguous(out_in.to(at::kBFloat16));
  const at::Tensor lse = lse_in.to(at::kFloat).contiguous();
  const auto opts = q.options().dtype(grad_dtype);
  at::Tensor dq = at::empty({d.batch, d.heads, d.q_len, d.qk_head_dim}, opts);
  at::Tensor dk = at::empty({d.batch, d.kv_heads, d.kv_len, d.qk_head_dim}, opts);
  at::Tensor dv = at::empty({d.batch, d.kv_heads, d.kv_len, d.v_head_dim}, opts);
  auto run = [&](auto* typed) {
    using G = std::remove_pointer_t<decltype(typed)>;
    kernels::attention_backward_cpu<G>(
        d, bf16(grad_out), strides_of(grad_out), bf16(q), strides_of(q), bf16(k), strides_of(k), bf16(v), strides_of(v),
        bf16(out), strides_of(out), lse.const_data_ptr<float>(), dq.mutable_data_ptr<G>(), dk.mutable_data_ptr<G>(),
        dv.mutable_data_ptr<G>(),
        products.value_or(kernels::default_attention_products(d.qk_head_dim, d.v_head_dim)));
  };
  if (grad_dtype == at::kFloat) {
    run(static_cast<float*>(nullptr));
  } else {
    run(static_cast<at::BFloat16*>(nullptr));
  }
  return {dq, dk, dv};
}

}  // namespace titan::model
