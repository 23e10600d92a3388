// tests/attention_reference.h — the float64 softmax that the attention kernels and blocks are
// checked against (tests/test_attention_kernel.cpp, tests/test_attention_window.cpp): the result
// on the same bf16 / float32 inputs under a dense mask, and the magnitudes the error bounds are
// built from (the bounds themselves are derived in test_attention_kernel.cpp's header).
#pragma once

#include <ATen/ops/exp.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/zeros.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>

namespace titan::testing {

constexpr double kU = 1.0 / (1 << 24);    // float32 unit roundoff
constexpr double kBf16 = 1.0 / (1 << 8);  // bfloat16 unit roundoff (8 significant bits)

inline void check_within(const at::Tensor& actual, const at::Tensor& expected, const at::Tensor& bound,
                         const char* what) {
  const at::Tensor diff = (actual.to(at::kDouble) - expected).abs();
  const at::Tensor excess = diff - bound;
  INFO(what << ": max |diff| " << diff.max().item<double>() << ", max |diff| / bound "
            << (diff / bound).max().item<double>());
  CHECK(excess.max().item<double>() <= 0.0);
}

inline at::Tensor repeat_heads(const at::Tensor& kv, int64_t heads) {
  return kv.repeat_interleave(heads / kv.size(1), 1);
}
inline at::Tensor sum_groups(const at::Tensor& g, int64_t kv_heads) {
  const auto s = g.sizes();
  return g.view({s[0], kv_heads, s[1] / kv_heads, s[2], s[3]}).sum(2);
}

// The keys hidden from each query [Sq, Sk] bool, written element by element from the formula of
// Note [Banded attention masks] (model/attention_blocks.h): query i sees key j iff
// (!causal || j <= i + key_offset) && (window == 0 || i + key_offset - j < window).
inline at::Tensor hidden_keys(int64_t sq, int64_t sk, bool causal, int64_t window, int64_t key_offset) {
  at::Tensor hidden = at::zeros({sq, sk}, at::kBool);
  auto h = hidden.accessor<bool, 2>();
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < sk; ++j)
      h[i][j] = !((!causal || j <= i + key_offset) && (window == 0 || i + key_offset - j < window));
  return hidden;
}

// lse with -inf (a row that sees no key) as 0: what such a row's exponent subtracts.
inline at::Tensor finite_lse(const at::Tensor& lse) { return lse.masked_fill(lse.isneginf(), 0.0); }

// Everything of the float64 reference one case needs: the result, and the magnitudes the bounds
// are built from. A row that sees no key has lse -inf, p and out 0.
struct Reference {
  at::Tensor out, lse, p;  // [B, H, Sq, v_hd], [B, H, Sq], [B, H, Sq, Sk]
  at::Tensor row_error;    // E per row [B, H, Sq, 1]
  at::Tensor k, v, q;      // float64, k/v repeated to H heads
};

inline Reference reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                           std::optional<double> scale_in = std::nullopt, int64_t window = 0,
                           int64_t key_offset = 0) {
  Reference r;
  const int64_t heads = q.size(1), qk_hd = q.size(3), sk = k.size(2);
  const double scale = scale_in.value_or(1.0 / std::sqrt(static_cast<double>(qk_hd)));
  r.q = q.to(at::kDouble);
  r.k = repeat_heads(k, heads).to(at::kDouble);
  r.v = repeat_heads(v, heads).to(at::kDouble);
  at::Tensor s = at::matmul(r.q, r.k.transpose(-1, -2)) * scale;
  at::Tensor s_abs = at::matmul(r.q.abs(), r.k.abs().transpose(-1, -2)) * scale;
  if (causal || window > 0) {
    const at::Tensor hidden = hidden_keys(q.size(2), sk, causal, window, key_offset);
    s.masked_fill_(hidden, -std::numeric_limits<double>::infinity());
    s_abs.masked_fill_(hidden, 0.0);
  }
  r.lse = at::logsumexp(s, {-1});
  r.p = at::exp(s - finite_lse(r.lse).unsqueeze(-1));
  r.out = at::matmul(r.p, r.v);
  r.row_error = (2.0 * (qk_hd + 2) * kU) * std::get<0>(s_abs.max(-1, true)) +
                (finite_lse(r.lse).abs().unsqueeze(-1) + static_cast<double>(sk + 24)) * kU;
  return r;
}

// The float64 gradients of the reference `r` for the output gradient `dout` (float64).
struct ReferenceGrads {
  at::Tensor dq, dk, dv;
};
inline ReferenceGrads reference_grads(const Reference& r, const at::Tensor& dout, double scale, int64_t kv_heads) {
  const at::Tensor dp = at::matmul(dout, r.v.transpose(-1, -2));
  const at::Tensor ds = r.p * (dp - (dout * r.out).sum(-1, true)) * scale;
  return {at::matmul(ds, r.k), sum_groups(at::matmul(ds.transpose(-1, -2), r.q), kv_heads),
          sum_groups(at::matmul(r.p.transpose(-1, -2), dout), kv_heads)};
}

// Tolerances relative to the largest magnitude of the float64 result. float32 (LibTorch's flash
// kernel, v padded to q's head size; the math form): every result is a float32 sum of at most
// Sk x hd (here <= 520 x 192) rounded products, its error a few hundred u = 2^-24 of the largest
// term at worst, the softmax weights summing to 1: 1e-5 holds with a wide margin and an index,
// mask or scale gone wrong is off by O(0.1). bfloat16 over short key ranges (the blocks of these
// tests, at most 24 keys a row): the outputs and gradients are rounded to bf16 (2^-9 relative),
// and P / dS are rounded to bf16 before their products in LibTorch's kernel and in bf16 dot
// products (2^-9 of each of at most 24 terms): within 1e-2 of the largest magnitude (measured:
// up to 2e-3).
inline double relative_tolerance(at::ScalarType dtype) { return dtype == at::kFloat ? 1e-5 : 1e-2; }

inline void check_close(const at::Tensor& got, const at::Tensor& want, double relative, const char* what) {
  const double diff = (got.to(at::kDouble) - want).abs().max().item<double>();
  const double largest = want.abs().max().item<double>();
  INFO(what << ": max |diff| " << diff << ", largest |value| " << largest << ", relative tolerance " << relative);
  CHECK(diff <= relative * largest);
}

}  // namespace titan::testing
