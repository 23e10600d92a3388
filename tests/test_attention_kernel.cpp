// The bfloat16 CPU attention kernel (model/kernels/attention.h) against the explicit softmax in
// float64 on the same bf16 inputs (tests/attention_reference.h), forward and backward, causal and
// not, sliding windows and key offsets (Note [Banded attention masks] in model/attention_blocks.h)
// with rows that see no key, grouped-query heads, strided operands, a v head size other than q's
// and k's with an explicit scale (Note [Attention head sizes and scale]); its key ranges; its
// wiring into attention_op's autograd; thread-count independence.
//
// Tolerances come from float32 rounding (u = 2^-24) and the bf16 output rounding (2^-8
// relative), bounded by the terms themselves (absolute values of every operand, in float64):
// - a score s = scale q.k is a float32 dot of qk_hd products: |err| <= (qk_hd + 2) u scale |q|.|k|;
// - p = exp(s - lse) then carries that error (exp's derivative is p itself), plus lse's own
//   (its float32 rounding, u |lse|, and the sum of up to Sk terms in it, Sk u) and the exp
//   polynomial's (~20 ulp, as LibTorch's flash kernel): a relative error per row
//   E = 2 (hd + 2) u max_j |s|_j + (|lse| + Sk + 24) u (2: the score error enters through s
//   and through the row maximum);
// - each float32 GEMM over n terms adds (n + 2) u times the sum of the terms' magnitudes;
// - with bf16 dot products (kBf16Dot), q.k and dO.v are exact bf16 products summed in float32 as
//   above, but P and dS are rounded to bf16 before their products (as LibTorch's flash kernel
//   rounds P): each such product gains 2^-8 times the sum of its terms' magnitudes.
// Observed: the float32 parts stay 25x or more inside their bounds; the bf16 roundings of the
// outputs reach up to their 2^-8 bound, as rounding to nearest does. An index, a mask or a scale
// gone wrong gives O(1) errors. Under a mask the same bounds hold row by row over the keys the
// row sees (the reference's terms of hidden keys are 0).
#include <ATen/Parallel.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "model/activation_checkpoint_ops.h"
#include "model/attention_blocks.h"
#include "model/kernels/attention.h"
#include "tests/attention_reference.h"
#include "util/cpu_features.h"

using namespace titan::model;
using namespace titan::testing;

namespace {

struct Case {
  int64_t batch, heads, kv_heads, q_len, kv_len, head_dim;
  bool causal;
  bool strided;  // q/k/v as transposes of [B, S, heads, hd] (what the model hands over)
  int64_t v_head_dim = 0;        // 0: head_dim
  std::optional<double> scale;   // unset: 1 / sqrt(head_dim)
  int64_t window = 0, key_offset = 0;  // the band (Note [Banded attention masks] in model/attention_blocks.h)
  int64_t v_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
};

at::Tensor operand(const Case& c, int64_t heads, int64_t len, int64_t head_dim) {
  if (c.strided) return at::randn({c.batch, len, heads, head_dim}).to(at::kBFloat16).transpose(1, 2);
  return at::randn({c.batch, heads, len, head_dim}).to(at::kBFloat16);
}

using titan::model::kernels::AttentionProducts;

// Whether this CPU runs the kernel's build target (reported skipped otherwise).
bool kernel_builds_here() {
  if (titan::util::cpu_has_avx2_kernels()) return true;
  WARN("skipped: this CPU lacks AVX2/FMA, the kernel's build target");
  return false;
}

// The products the kernel can run here: float32 FMAs always, bf16 dot products where the CPU
// has them (reported skipped otherwise).
std::vector<AttentionProducts> products_here() {
  if (titan::model::kernels::cpu_has_bf16_dot_products())
    return {AttentionProducts::kFloat32, AttentionProducts::kBf16Dot};
  WARN("bf16 dot products skipped: this CPU lacks AVX512-BF16");
  return {AttentionProducts::kFloat32};
}

void check_case(const Case& c, AttentionProducts products) {
  const double p_rounding = products == AttentionProducts::kBf16Dot ? kBf16 : 0.0;  // P and dS as bf16
  INFO((products == AttentionProducts::kBf16Dot ? "bf16 dot products" : "float32 products"));
  INFO("B " << c.batch << " H " << c.heads << " KV " << c.kv_heads << " Sq " << c.q_len << " Sk " << c.kv_len << " hd "
            << c.head_dim << " v_hd " << c.v_dim() << (c.causal ? " causal" : "") << (c.strided ? " strided" : "")
            << (c.scale ? " explicit scale" : "") << " window " << c.window << " key_offset " << c.key_offset);
  const at::Tensor q = operand(c, c.heads, c.q_len, c.head_dim), k = operand(c, c.kv_heads, c.kv_len, c.head_dim),
                   v = operand(c, c.kv_heads, c.kv_len, c.v_dim()), grad_out = operand(c, c.heads, c.q_len, c.v_dim());
  const Reference r = reference(q, k, v, c.causal, c.scale, c.window, c.key_offset);
  const int64_t group = c.heads / c.kv_heads;

  auto [out, lse] = cpu_attention_forward(q, k, v, c.causal, c.scale, c.window, c.key_offset, products);
  REQUIRE(out.sizes() == at::IntArrayRef({c.batch, c.heads, c.q_len, c.v_dim()}));
  REQUIRE(out.scalar_type() == at::kBFloat16);
  const at::Tensor p_abs_v = at::matmul(r.p, r.v.abs());
  const at::Tensor out_err = r.row_error + static_cast<double>(c.kv_len + 2) * kU;
  check_within(out, r.out, kBf16 * r.out.abs() + (2.0 * out_err + p_rounding) * p_abs_v, "out");
  // A row that sees no key: lse exactly -inf (its out 0 is checked above: bound 0).
  CHECK(at::equal(lse.isneginf(), r.lse.isneginf()));
  check_within(finite_lse(lse), finite_lse(r.lse), r.row_error.squeeze(-1), "lse");

  // The backward from the reference's lse (float32) and the kernel's own bf16 out.
  const at::Tensor o = out.to(at::kDouble), dout = grad_out.to(at::kDouble);
  const double scale = c.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  const at::Tensor dp = at::matmul(dout, r.v.transpose(-1, -2));
  const at::Tensor delta = (dout * o).sum(-1, true);
  const at::Tensor ds = r.p * (dp - delta) * scale;
  const at::Tensor dq_ref = at::matmul(ds, r.k);
  const at::Tensor dk_ref = sum_groups(at::matmul(ds.transpose(-1, -2), r.q), c.kv_heads);
  const at::Tensor dv_ref = sum_groups(at::matmul(r.p.transpose(-1, -2), dout), c.kv_heads);
  // |dS| bound: P (|dO| |V|^T + rowsum |dO| |O|) scale, each factor's error as above.
  const at::Tensor ds_abs =
      r.p * (at::matmul(dout.abs(), r.v.abs().transpose(-1, -2)) + (dout.abs() * o.abs()).sum(-1, true)) * scale;
  // dP and rowsum(dO * O) are sums over v's head_dim
  const at::Tensor ds_err = r.row_error + static_cast<double>(c.v_dim() + 4) * kU;  // relative, per row
  const double sum_terms = static_cast<double>(c.q_len * group + 2) * kU;

  for (const auto grad_dtype : {at::kFloat, at::kBFloat16}) {
    INFO((grad_dtype == at::kFloat ? "float32" : "bfloat16") << " gradients");
    auto [dq, dk, dv] =
        cpu_attention_backward(grad_out, q, k, v, out, lse.copy_(r.lse), c.causal, grad_dtype, c.scale, c.window,
                               c.key_offset, products);
    REQUIRE(dq.scalar_type() == grad_dtype);
    REQUIRE(dq.sizes() == q.sizes());
    REQUIRE(dk.sizes() == k.sizes());
    REQUIRE(dv.sizes() == v.sizes());
    const double rounding = grad_dtype == at::kFloat ? 0.0 : kBf16;
    check_within(dq, dq_ref,
                 rounding * dq_ref.abs() + (2.0 * (ds_err + static_cast<double>(c.kv_len + 2) * kU) + p_rounding) *
                                               at::matmul(ds_abs, r.k.abs()),
                 "dq");
    check_within(
        dk, dk_ref,
        rounding * dk_ref.abs() +
            sum_groups(at::matmul((ds_abs * (2.0 * (ds_err + sum_terms) + p_rounding)).transpose(-1, -2), r.q.abs()),
                       c.kv_heads),
        "dk");
    check_within(
        dv, dv_ref,
        rounding * dv_ref.abs() +
            sum_groups(at::matmul((r.p * (2.0 * (r.row_error + sum_terms) + p_rounding)).transpose(-1, -2), dout.abs()),
                       c.kv_heads),
        "dv");
  }
}

}  // namespace

TEST_CASE("bf16 CPU attention equals the float64 softmax up to its float32 and bf16 roundings", "[attention]") {
  if (!kernel_builds_here()) return;
  at::manual_seed(7);
  // Shapes that exercise every path: tiles of 32 rows and their tails, head_dim below, at and
  // above one register block (16 floats), grouped-query heads, non-square non-causal blocks
  // (ring attention), strided operands.
  for (const AttentionProducts products : products_here()) {
    check_case({2, 4, 2, 37, 37, 16, true, false}, products);
    check_case({1, 2, 2, 20, 45, 24, false, false}, products);
    check_case({2, 3, 3, 70, 70, 64, true, true}, products);
    check_case({1, 4, 1, 33, 33, 8, true, true}, products);
    check_case({1, 2, 1, 65, 31, 40, false, true}, products);
    // q/k head 48, v head 32 (tails of a register block on both sides), DeepSeek-V3's 192 / 128
    // at a small size; scale 0.7 / sqrt(qk_hd), as YaRN's mscale^2 changes it
    check_case({2, 4, 2, 37, 37, 48, true, true, 32, 0.7 / std::sqrt(48.0)}, products);
    check_case({1, 2, 2, 20, 45, 48, false, false, 32, 0.7 / std::sqrt(48.0)}, products);
    check_case({1, 2, 1, 24, 24, 192, true, true, 128, 0.7 / std::sqrt(192.0)}, products);
  }
}

TEST_CASE("bf16 CPU attention with a window or a key offset equals the float64 masked softmax", "[attention]") {
  if (!kernel_builds_here()) return;
  at::manual_seed(17);
  // The same bounds as the unmasked cases: each row's are built from its visible keys only (the
  // reference's hidden terms are 0), and a row that sees no key must give lse -inf, out 0 and
  // zero gradients exactly. Tiles of 32 rows over key ranges that start past key 0 (rounded
  // down to a panel: 16 or 32 keys), so the masked head of a range is exercised too.
  const std::optional<double> unset;
  for (const AttentionProducts products : products_here()) {
    // gpt-oss's sliding window (W < S) with grouped-query heads, q/k head 32 and v head 16
    check_case({2, 4, 2, 100, 100, 32, true, false, 16, unset, 24, 0}, products);
    check_case({1, 2, 2, 70, 70, 16, true, true, 0, unset, 1, 0}, products);    // window 1: the key itself
    check_case({1, 2, 1, 40, 40, 16, true, false, 0, unset, 64, 0}, products);  // window >= S: causal
    // a past ring block (the key chunk just before the query chunk): queries 48 positions after
    // key 0, no causality, W 40: row i sees keys i + 9 .. 47, rows 39 on see none
    check_case({1, 4, 2, 40, 48, 16, false, true, 0, unset, 40, 48}, products);
    // the last queries of a causal sequence (positions 36..59) with a window of 20
    check_case({1, 2, 1, 24, 60, 40, true, false, 24, 0.7 / std::sqrt(40.0), 20, 36}, products);
    check_case({1, 2, 2, 30, 20, 16, true, false, 0, unset, 0, -5}, products);  // rows 0..4 see no key
  }
}

TEST_CASE("bf16 CPU attention: a window as long as the block is the causal attention, bit for bit",
          "[attention]") {
  if (!kernel_builds_here()) return;
  at::manual_seed(19);
  const at::Tensor q = at::randn({1, 4, 70, 32}).to(at::kBFloat16), k = at::randn({1, 2, 70, 32}).to(at::kBFloat16),
                   v = at::randn({1, 2, 70, 32}).to(at::kBFloat16), g = at::randn({1, 4, 70, 32}).to(at::kBFloat16);
  for (const AttentionProducts products : products_here()) {
    // Every row's range starts at key 0 when window >= S: the same tiles, the same products.
    auto [out, lse] = cpu_attention_forward(q, k, v, true, std::nullopt, 0, 0, products);
    auto [out_w, lse_w] = cpu_attention_forward(q, k, v, true, std::nullopt, 70, 0, products);
    CHECK(at::equal(out, out_w));
    CHECK(at::equal(lse, lse_w));
    auto grads = cpu_attention_backward(g, q, k, v, out, lse, true, at::kFloat, std::nullopt, 0, 0, products);
    auto grads_w = cpu_attention_backward(g, q, k, v, out, lse, true, at::kFloat, std::nullopt, 70, 0, products);
    CHECK(at::equal(std::get<0>(grads), std::get<0>(grads_w)));
    CHECK(at::equal(std::get<1>(grads), std::get<1>(grads_w)));
    CHECK(at::equal(std::get<2>(grads), std::get<2>(grads_w)));
  }
}

TEST_CASE("the CPU kernel's key ranges: each row's band, each tile's span from its first row to its last",
          "[attention]") {
  using titan::model::kernels::AttentionDims;
  using titan::model::kernels::tile_keys;
  using titan::model::kernels::visible_keys;
  // batch, heads, kv heads, Sq, Sk, head sizes, causal, scale, window, key_offset
  const AttentionDims sliding{1, 1, 1, 2048, 2048, 64, 64, true, 0.125f, 128, 0};
  CHECK(visible_keys(sliding, 0).begin == 0);
  CHECK(visible_keys(sliding, 0).end == 1);
  CHECK(visible_keys(sliding, 1000).begin == 873);  // 128 keys: 873 .. 1000
  CHECK(visible_keys(sliding, 1000).end == 1001);
  // A tile of 32 rows from 1000 multiplies over keys 864 (873 rounded down to 32) .. 1032: 168
  // keys, not the 1032 of the causal prefix.
  CHECK(tile_keys(sliding, 1000, 32, 32).begin == 864);
  CHECK(tile_keys(sliding, 1000, 32, 32).end == 1032);
  const AttentionDims causal{1, 1, 1, 64, 64, 16, 16, true, 0.25f};
  CHECK(tile_keys(causal, 32, 32, 16).begin == 0);  // no window: the prefix, as before
  CHECK(tile_keys(causal, 32, 32, 16).end == 64);
  // A past ring block (queries 48 positions after key 0, W 40): row i sees i + 9 .. 47; rows
  // from 39 on see nothing, a tile of only such rows is empty.
  const AttentionDims past{1, 1, 1, 64, 48, 16, 16, false, 0.25f, 40, 48};
  CHECK(visible_keys(past, 0).begin == 9);
  CHECK(visible_keys(past, 0).end == 48);
  CHECK(visible_keys(past, 39).begin == 48);
  CHECK(tile_keys(past, 0, 32, 16).begin == 0);  // 9 rounded down
  CHECK(tile_keys(past, 40, 24, 16).end - tile_keys(past, 40, 24, 16).begin == 0);
  // Causal with a negative offset: the first rows see nothing, the range starts at key 0.
  const AttentionDims late{1, 1, 1, 30, 20, 16, 16, true, 0.25f, 0, -5};
  CHECK(visible_keys(late, 4).end == 0);
  CHECK(visible_keys(late, 5).end == 1);
  CHECK(tile_keys(late, 0, 4, 16).end == 0);
}

TEST_CASE("bf16 CPU attention is the same bits on 1 and 2 threads", "[attention]") {
  if (!kernel_builds_here()) return;
  at::manual_seed(3);
  const at::Tensor q = at::randn({2, 4, 50, 16}).to(at::kBFloat16), k = at::randn({2, 2, 50, 16}).to(at::kBFloat16),
                   v = at::randn({2, 2, 50, 16}).to(at::kBFloat16), g = at::randn({2, 4, 50, 16}).to(at::kBFloat16);
  const int threads = at::get_num_threads();
  auto run = [&](int n, AttentionProducts products) {
    at::set_num_threads(n);
    auto [out, lse] = cpu_attention_forward(q, k, v, true, std::nullopt, 0, 0, products);
    auto grads = cpu_attention_backward(g, q, k, v, out, lse, true, at::kFloat, std::nullopt, 0, 0, products);
    return std::make_tuple(out, lse, std::get<0>(grads), std::get<1>(grads), std::get<2>(grads));
  };
  for (const AttentionProducts products : products_here()) {
    const auto one = run(1, products), two = run(2, products);
    at::set_num_threads(threads);
    CHECK(at::equal(std::get<0>(one), std::get<0>(two)));
    CHECK(at::equal(std::get<1>(one), std::get<1>(two)));
    CHECK(at::equal(std::get<2>(one), std::get<2>(two)));
    CHECK(at::equal(std::get<3>(one), std::get<3>(two)));
    CHECK(at::equal(std::get<4>(one), std::get<4>(two)));
  }
}

TEST_CASE("attention_op in bf16 runs the CPU kernel through autograd, grouped-query heads included", "[attention]") {
  if (!kernel_builds_here()) return;
  at::manual_seed(11);
  const at::Tensor q = at::randn({2, 4, 40, 16}).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor k = at::randn({2, 2, 40, 16}).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor v = at::randn({2, 2, 40, 16}).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor g = at::randn({2, 4, 40, 16}).to(at::kBFloat16);
  REQUIRE(cpu_attention_kernel_applies(q, v));
  // head_dim 16: float32 FMAs, which hand longer key ranges to LibTorch's flash kernel
  CHECK_FALSE(cpu_attention_kernel_applies(at::kBFloat16, 16, 16, kCpuAttentionMaxKeys + 1));
  CHECK_FALSE(cpu_attention_kernel_applies(q.to(at::kFloat), v));  // float32: LibTorch's, bit for bit as before
  const at::Tensor out = attention_op(q, k, v);
  auto grads = torch::autograd::grad({out}, {q, k, v}, {g});
  // The kernel called directly gives the same bits: attention_op adds nothing but autograd.
  auto [out_direct, lse] = cpu_attention_forward(q.detach(), k.detach(), v.detach(), true);
  auto [dq, dk, dv] =
      cpu_attention_backward(g, q.detach(), k.detach(), v.detach(), out_direct, lse, true, at::kBFloat16);
  CHECK(at::equal(out, out_direct));
  CHECK(at::equal(grads[0], dq));
  CHECK(at::equal(grads[1], dk));
  CHECK(at::equal(grads[2], dv));
}

TEST_CASE("ring attention's bf16 blocks through the CPU kernel merge to the whole attention", "[attention]") {
  if (!kernel_builds_here()) return;
  at::manual_seed(5);
  // Two blocks of keys (20 + 28) seen by 24 queries, as a ring step sees another rank's chunk.
  const at::Tensor q = at::randn({1, 2, 24, 16}).to(at::kBFloat16), k = at::randn({1, 1, 48, 16}).to(at::kBFloat16),
                   v = at::randn({1, 1, 48, 16}).to(at::kBFloat16), g = at::randn({1, 2, 24, 16}).to(at::kBFloat16);
  auto [out, lse] = cpu_attention_forward(q, k, v, false);
  at::Tensor acc_out = at::zeros({1, 2, 24, 16}, at::kFloat);
  at::Tensor acc_lse = at::full({1, 2, 24}, -std::numeric_limits<float>::infinity(), at::kFloat);
  const at::Tensor k1 = k.slice(2, 0, 20), v1 = v.slice(2, 0, 20), k2 = k.slice(2, 20), v2 = v.slice(2, 20);
  merge_attention_block(acc_out, acc_lse, attention_block_forward(q, k1, v1, false));
  merge_attention_block(acc_out, acc_lse, attention_block_forward(q, k2, v2, false));
  // Each block's out is rounded to bf16 before the merge (weights exp(lse_b - lse), summing to 1),
  // the whole's after: each is within 2^-8 of sum_j p_j |v_j|; the merge's own float32 roundings
  // are a handful of u on top.
  const Reference r = reference(q, k, v, false);
  const at::Tensor p_abs_v = at::matmul(r.p, r.v.abs());
  check_within(acc_out, out.to(at::kDouble), (2 * kBf16 + 16 * kU) * p_abs_v, "merged out");
  check_within(acc_lse, lse.to(at::kDouble), 16 * kU * (1.0 + lse.to(at::kDouble).abs()), "merged lse");
  // Backward per block from the whole's out and lse: each key's gradient is computed from the same
  // products in the same order as in the whole, so dk and dv are the whole's bits; dq is the sum
  // of the two blocks' partial sums instead of one.
  auto [dq, dk, dv] = cpu_attention_backward(g, q, k, v, out, lse, false, at::kFloat);
  auto [dq1, dk1, dv1] = attention_block_backward(g, q, k1, v1, out, lse, false);
  auto [dq2, dk2, dv2] = attention_block_backward(g, q, k2, v2, out, lse, false);
  CHECK(at::equal(at::cat({dk1, dk2}, 2), dk));
  CHECK(at::equal(at::cat({dv1, dv2}, 2), dv));
  // dq: the same 48 products summed in another grouping, <= 2 (48 + 2) u sum_j |dS_j| |k_j| apart,
  // |dS| <= P (|dO| |V|^T + rowsum |dO| |O|) / sqrt(hd).
  const at::Tensor dout = g.to(at::kDouble), o = out.to(at::kDouble);
  const at::Tensor ds_abs =
      r.p * (at::matmul(dout.abs(), r.v.abs().transpose(-1, -2)) + (dout.abs() * o.abs()).sum(-1, true)) / 4.0;
  check_within(dq1 + dq2, dq.to(at::kDouble), 2 * 50 * kU * at::matmul(ds_abs, r.k.abs()), "dq over blocks");
}

// ---------------------------------------------------------------- unequal head sizes, explicit scale

namespace {

at::Tensor normal_of(at::IntArrayRef shape, at::ScalarType dtype) { return at::randn(shape).to(dtype); }

}  // namespace

TEST_CASE("attention_op takes a v head size other than q/k's and an explicit scale, float32 and bf16",
          "[attention]") {
  at::manual_seed(21);
  struct Dims {
    int64_t batch, heads, kv_heads, seq, qk_hd, v_hd;
  };
  // 48 / 32 with grouped-query heads; DeepSeek-V3's 192 / 128 small; 520 keys in bf16 with heads
  // that take float32 FMAs hand the sequence to LibTorch's bf16 flash kernel, v padded.
  const std::vector<Dims> shapes = {{2, 4, 2, 40, 48, 32}, {1, 2, 1, 24, 192, 128}, {1, 2, 1, 520, 48, 32}};
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const Dims& d : shapes) {
      if (d.seq > kCpuAttentionMaxKeys && dtype == at::kFloat) continue;  // float32 has its path at every length
      const double scale = 0.7 / std::sqrt(static_cast<double>(d.qk_hd));
      INFO((dtype == at::kFloat ? "float32" : "bfloat16") << ", S " << d.seq << ", qk_hd " << d.qk_hd << ", v_hd "
                                                          << d.v_hd);
      const at::Tensor q = normal_of({d.batch, d.heads, d.seq, d.qk_hd}, dtype).requires_grad_(true);
      const at::Tensor k = normal_of({d.batch, d.kv_heads, d.seq, d.qk_hd}, dtype).requires_grad_(true);
      const at::Tensor v = normal_of({d.batch, d.kv_heads, d.seq, d.v_hd}, dtype).requires_grad_(true);
      const at::Tensor g = normal_of({d.batch, d.heads, d.seq, d.v_hd}, dtype);
      INFO("titan's kernel: " << (cpu_attention_kernel_applies(q, v) ? "yes" : "no (LibTorch's flash, v padded)"));
      const at::Tensor out = attention_op(q, k, v, scale);
      REQUIRE(out.sizes() == at::IntArrayRef({d.batch, d.heads, d.seq, d.v_hd}));
      const auto grads = torch::autograd::grad({out}, {q, k, v}, {g});
      const Reference r = reference(q.detach(), k.detach(), v.detach(), /*causal=*/true, scale);
      const ReferenceGrads want = reference_grads(r, g.to(at::kDouble), scale, d.kv_heads);
      if (dtype == at::kFloat) {
        const double tol = relative_tolerance(dtype);
        check_close(out, r.out, tol, "out");
        check_close(grads[0], want.dq, tol, "dq");
        check_close(grads[1], want.dk, tol, "dk");
        check_close(grads[2], want.dv, tol, "dv");
        continue;
      }
      // bf16: over 520 keys a bound relative to the largest value has no margin left (LibTorch's
      // kernel rounds P and dS to bf16, each of up to 520 terms off by 2^-9 of itself), so the
      // bound is built from the terms, as check_case's: each result is rounded to bf16 (2^-9 of
      // it), and each term of its sum is off by at most 2^-8 of its magnitude (P or dS rounded to
      // bf16, 2^-9; dS also through rowsum(dO * O) from the bf16 output, 2^-9 of rowsum |dO| |O|);
      // float32's roundings are 2^-16 of those. Bound: 2^-8 (|result| + 2 sum |terms|).
      const at::Tensor dout = g.to(at::kDouble);
      const at::Tensor ds_abs =
          r.p * (at::matmul(dout.abs(), r.v.abs().transpose(-1, -2)) + (dout.abs() * r.out.abs()).sum(-1, true)) *
          scale;
      auto bound = [](const at::Tensor& result, const at::Tensor& terms) { return kBf16 * (result.abs() + 2.0 * terms); };
      check_within(out, r.out, bound(r.out, at::matmul(r.p, r.v.abs())), "out");
      check_within(grads[0], want.dq, bound(want.dq, at::matmul(ds_abs, r.k.abs())), "dq");
      check_within(grads[1], want.dk,
                   bound(want.dk, sum_groups(at::matmul(ds_abs.transpose(-1, -2), r.q.abs()), d.kv_heads)), "dk");
      check_within(grads[2], want.dv,
                   bound(want.dv, sum_groups(at::matmul(r.p.transpose(-1, -2), dout.abs()), d.kv_heads)), "dv");
    }
  }
}

TEST_CASE("attention blocks with a v head size other than q/k's and an explicit scale merge to the whole",
          "[attention]") {
  at::manual_seed(23);
  // Queries 24..47 of a causal sequence of 48: the past block (keys 0..23, no mask) and the
  // diagonal block (keys 24..47, causal), merged by their log-sum-exp; each block's backward from
  // the merged (out, lse). The float64 reference takes the output gradient of rows 24..47 only,
  // so its dk / dv are what the two blocks' must sum to.
  for (const auto& [qk_hd, v_hd] : std::vector<std::pair<int64_t, int64_t>>{{48, 32}, {192, 128}}) {
    const double scale = 0.7 / std::sqrt(static_cast<double>(qk_hd));
    const at::Tensor q = at::randn({1, 4, 48, qk_hd}), k = at::randn({1, 2, 48, qk_hd}), v = at::randn({1, 2, 48, v_hd});
    at::Tensor dout = at::randn({1, 4, 48, v_hd});
    dout.narrow(2, 0, 24).zero_();
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (bool math : {false, true}) {
        if (math && dtype == at::kBFloat16) continue;  // the math form is the float32 / float64 reference path
        INFO((dtype == at::kFloat ? "float32" : "bfloat16") << (math ? " math" : " kernels") << ", qk_hd " << qk_hd
                                                            << ", v_hd " << v_hd);
        auto fwd = math ? attention_block_forward_math : attention_block_forward;
        auto bwd = math ? attention_block_backward_math : attention_block_backward;
        const at::Tensor qd = q.to(dtype), kd = k.to(dtype), vd = v.to(dtype), gd = dout.to(dtype);
        const Reference r = reference(qd, kd, vd, /*causal=*/true, scale);
        const ReferenceGrads want = reference_grads(r, gd.to(at::kDouble), scale, 2);
        const at::Tensor q2 = qd.narrow(2, 24, 24), g2 = gd.narrow(2, 24, 24);
        const at::Tensor k_past = kd.narrow(2, 0, 24), v_past = vd.narrow(2, 0, 24);
        const at::Tensor k_diag = kd.narrow(2, 24, 24), v_diag = vd.narrow(2, 24, 24);
        at::Tensor out = at::zeros({1, 4, 24, v_hd}), lse = at::full({1, 4, 24}, -INFINITY);
        merge_attention_block(out, lse, fwd(q2, k_past, v_past, false, scale, 0, 0));
        merge_attention_block(out, lse, fwd(q2, k_diag, v_diag, true, scale, 0, 0));
        const double tol = relative_tolerance(dtype);
        check_close(out, r.out.narrow(2, 24, 24), tol, "merged out");
        check_close(lse, r.lse.narrow(2, 24, 24), 1e-5, "merged lse");  // float32 in both dtypes
        const at::Tensor o2 = out.to(dtype);
        auto [dq_past, dk_past, dv_past] = bwd(g2, q2, k_past, v_past, o2, lse, false, scale, 0, 0);
        auto [dq_diag, dk_diag, dv_diag] = bwd(g2, q2, k_diag, v_diag, o2, lse, true, scale, 0, 0);
        REQUIRE(dk_past.sizes() == k_past.sizes());
        REQUIRE(dv_past.sizes() == v_past.sizes());
        check_close(dq_past + dq_diag, want.dq.narrow(2, 24, 24), tol, "dq");
        check_close(at::cat({dk_past, dk_diag}, 2), want.dk, tol, "dk");
        check_close(at::cat({dv_past, dv_diag}, 2), want.dv, tol, "dv");
      }
    }
  }
}
