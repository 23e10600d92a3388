// Attention blocks under banded masks (Note [Banded attention masks] in model/attention_blocks.h):
// sliding windows and key offsets through attention_block_forward / _backward in float32 (the
// math form: LibTorch's flash kernel takes no window) and bfloat16 (titan's CPU kernel), against
// the float64 dense-mask softmax (tests/attention_reference.h); blocks whose rows see no key and
// their merge; a windowed sequence cut into ring blocks, each with its offset, merged back; the
// masks that mask nothing in a block running today's kernels bit for bit; argument errors; on
// CUDA, the flash kernels' windows against the math form.
//
// Tolerances: relative_tolerance (tests/attention_reference.h, derived there): float32 sums of
// at most 48 keys x 32 products, a few dozen u = 2^-24 of the largest magnitude, within 1e-5 of
// it; bf16 rows of at most 24 visible keys, their outputs, P and dS rounded to bf16, within 1e-2.
// Mask errors (a key seen or missed) move results by O(0.1) of the largest value.
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "model/attention_blocks.h"
#include "tests/attention_reference.h"

using namespace titan::model;
using namespace titan::testing;

namespace {

const char* name_of(at::ScalarType dtype) { return dtype == at::kFloat ? "float32" : "bfloat16"; }

// Accumulators of a merge over key blocks: out [B, H, Sq, v_hd] 0, lse [B, H, Sq] -inf.
struct Merged {
  at::Tensor out, lse;
  Merged(int64_t b, int64_t h, int64_t sq, int64_t v_hd)
      : out(at::zeros({b, h, sq, v_hd})), lse(at::full({b, h, sq}, -std::numeric_limits<float>::infinity())) {}
};

// dq and dk against the magnitude of their terms rather than of themselves: they vanish where a
// row sees one key (window 1: P = 1, so dP = rowsum(dO * O) and dS = 0 up to rounding). Terms:
// sum_j |dS_ij| |k_j| (dq) and sum_i |dS_ij| |q_i| (dk), |dS| <= P (|dO| |V|^T + rowsum |dO| |O|) scale.
void check_qk_grads(const at::Tensor& dq, const at::Tensor& dk, const Reference& r, const ReferenceGrads& want,
                    const at::Tensor& dout, double scale, int64_t kv_heads, double relative) {
  const at::Tensor ds_abs =
      r.p * (at::matmul(dout.abs(), r.v.abs().transpose(-1, -2)) + (dout.abs() * r.out.abs()).sum(-1, true)) * scale;
  auto within = [&](const at::Tensor& got, const at::Tensor& expected, const at::Tensor& terms, const char* what) {
    const double diff = (got.to(at::kDouble) - expected).abs().max().item<double>();
    const double largest = terms.max().item<double>();
    INFO(what << ": max |diff| " << diff << ", largest term sum " << largest << ", relative tolerance " << relative);
    CHECK(diff <= relative * largest);
  };
  within(dq, want.dq, at::matmul(ds_abs, r.k.abs()), "dq");
  within(dk, want.dk, sum_groups(at::matmul(ds_abs.transpose(-1, -2), r.q.abs()), kv_heads), "dk");
}

}  // namespace

TEST_CASE("attention blocks with a window or a key offset equal the float64 masked softmax, float32 and bf16",
          "[attention]") {
  at::manual_seed(31);
  struct Mask {
    int64_t q_len, kv_len;
    bool causal;
    int64_t window, key_offset;
  };
  // A sliding window over a square, window 1, a past ring block (queries 24 positions after key
  // 0, rows from 19 on see none), the last queries of a causal sequence with a window.
  const std::vector<Mask> masks = {
      {40, 40, true, 12, 0}, {24, 24, true, 1, 0}, {30, 24, false, 20, 24}, {16, 40, true, 20, 24}};
  const double scale = 0.7 / std::sqrt(32.0);
  for (const Mask& m : masks) {
    // grouped-query heads, q/k head 32 and v head 16
    const at::Tensor q = at::randn({2, 4, m.q_len, 32}), k = at::randn({2, 2, m.kv_len, 32}),
                     v = at::randn({2, 2, m.kv_len, 16}), dout = at::randn({2, 4, m.q_len, 16});
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      INFO(name_of(dtype) << ", Sq " << m.q_len << " Sk " << m.kv_len << (m.causal ? " causal" : "") << " window "
                          << m.window << " key_offset " << m.key_offset);
      const at::Tensor qd = q.to(dtype), kd = k.to(dtype), vd = v.to(dtype), gd = dout.to(dtype);
      const Reference r = reference(qd, kd, vd, m.causal, scale, m.window, m.key_offset);
      const ReferenceGrads want = reference_grads(r, gd.to(at::kDouble), scale, 2);
      const AttentionBlockResult got = attention_block_forward(qd, kd, vd, m.causal, scale, m.window, m.key_offset);
      const double tol = relative_tolerance(dtype);
      check_close(got.out, r.out, tol, "out");
      CHECK(at::equal(got.lse.isneginf(), r.lse.isneginf()));  // rows that see no key
      check_close(finite_lse(got.lse), finite_lse(r.lse), 1e-5, "lse");  // float32 in both dtypes
      auto [dq, dk, dv] = attention_block_backward(gd, qd, kd, vd, got.out, got.lse, m.causal, scale, m.window,
                                                   m.key_offset);
      check_qk_grads(dq, dk, r, want, gd.to(at::kDouble), scale, 2, tol);
      check_close(dv, want.dv, tol, "dv");
    }
  }
}

TEST_CASE("a block whose rows see no key gives lse -inf, out 0, zero gradients; the merge keeps the rest",
          "[attention]") {
  at::manual_seed(37);
  const at::Tensor q = at::randn({1, 2, 16, 16}), k = at::randn({1, 2, 32, 16}), v = at::randn({1, 2, 32, 16});
  const at::Tensor dout = at::randn({1, 2, 16, 16});
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kDouble}) {
    INFO(c10::toString(dtype));
    const at::Tensor qd = q.to(dtype), kd = k.to(dtype), vd = v.to(dtype), gd = dout.to(dtype);
    const at::Tensor k_near = kd.narrow(2, 16, 16), v_near = vd.narrow(2, 16, 16);
    const at::Tensor k_far = kd.narrow(2, 0, 16), v_far = vd.narrow(2, 0, 16);
    // Queries 32..47 of a sequence with a window of 4: the diagonal block (keys 32..47) sees keys,
    // the block of keys 0..15 (key_offset 32: each query at least 17 positions past them) none.
    const AttentionBlockResult near = attention_block_forward(qd, k_near, v_near, true, std::nullopt, 4, 0);
    const AttentionBlockResult far = attention_block_forward(qd, k_far, v_far, false, std::nullopt, 4, 32);
    CHECK(far.lse.isneginf().all().item<bool>());
    CHECK(far.out.abs().max().item<double>() == 0.0);
    // Merged in either order, or an empty block alone: no NaN, and the near block's bits.
    Merged alone(1, 2, 16, 16), near_first(1, 2, 16, 16), far_first(1, 2, 16, 16), empty(1, 2, 16, 16);
    merge_attention_block(alone.out, alone.lse, near);
    merge_attention_block(near_first.out, near_first.lse, near);
    merge_attention_block(near_first.out, near_first.lse, far);
    merge_attention_block(far_first.out, far_first.lse, far);
    merge_attention_block(far_first.out, far_first.lse, near);
    merge_attention_block(empty.out, empty.lse, far);
    CHECK(at::equal(near_first.out, alone.out));
    CHECK(at::equal(near_first.lse, alone.lse));
    CHECK(at::equal(far_first.out, alone.out));
    CHECK(at::equal(far_first.lse, alone.lse));
    CHECK(empty.lse.isneginf().all().item<bool>());
    CHECK(empty.out.abs().max().item<double>() == 0.0);
    // The empty block's gradients from the merged result (and from its own -inf rows): zeros.
    const at::Tensor out = alone.out.to(dtype);
    for (const at::Tensor& lse : {alone.lse, far.lse}) {
      auto [dq, dk, dv] = attention_block_backward(gd, qd, k_far, v_far, out, lse, false, std::nullopt, 4, 32);
      CHECK(dq.abs().max().item<double>() == 0.0);
      CHECK(dk.abs().max().item<double>() == 0.0);
      CHECK(dv.abs().max().item<double>() == 0.0);
    }
  }
}

TEST_CASE("a windowed causal sequence cut into ring blocks, each with its key offset, merges to the whole",
          "[attention]") {
  at::manual_seed(41);
  // S = 48 in chunks of 16, window 20: queries 32..47 see the diagonal block (causal), the chunk
  // 16..31 (offset 16, the window masks its first keys) and the chunk 0..15 (offset 32: only keys
  // 13..15, and only for the first three queries). Each block's backward from the merged (out,
  // lse); the reference takes the output gradient of rows 32..47 only, so its dk / dv are what
  // the blocks' must be, chunk by chunk.
  const int64_t window = 20;
  const at::Tensor q = at::randn({1, 4, 48, 32}), k = at::randn({1, 2, 48, 32}), v = at::randn({1, 2, 48, 16});
  at::Tensor dout = at::randn({1, 4, 48, 16});
  dout.narrow(2, 0, 32).zero_();
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO(name_of(dtype));
    const at::Tensor qd = q.to(dtype), kd = k.to(dtype), vd = v.to(dtype), gd = dout.to(dtype);
    const Reference r = reference(qd, kd, vd, /*causal=*/true, std::nullopt, window);
    const ReferenceGrads want = reference_grads(r, gd.to(at::kDouble), 1.0 / std::sqrt(32.0), 2);
    const at::Tensor q3 = qd.narrow(2, 32, 16), g3 = gd.narrow(2, 32, 16);
    struct Block {
      int64_t k_start;
      bool causal;
    };
    const std::vector<Block> blocks = {{32, true}, {16, false}, {0, false}};
    Merged m(1, 4, 16, 16);
    for (const Block& b : blocks)
      merge_attention_block(m.out, m.lse,
                            attention_block_forward(q3, kd.narrow(2, b.k_start, 16), vd.narrow(2, b.k_start, 16),
                                                    b.causal, std::nullopt, window, 32 - b.k_start));
    const double tol = relative_tolerance(dtype);
    check_close(m.out, r.out.narrow(2, 32, 16), tol, "merged out");
    check_close(m.lse, r.lse.narrow(2, 32, 16), 1e-5, "merged lse");
    const at::Tensor o3 = m.out.to(dtype);
    at::Tensor dq = at::zeros({1, 4, 16, 32});
    std::vector<at::Tensor> dk(3), dv(3);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const Block& b = blocks[i];
      auto g = attention_block_backward(g3, q3, kd.narrow(2, b.k_start, 16), vd.narrow(2, b.k_start, 16), o3, m.lse,
                                        b.causal, std::nullopt, window, 32 - b.k_start);
      dq.add_(std::get<0>(g));
      dk[2 - i] = std::get<1>(g);  // blocks run from the last chunk back
      dv[2 - i] = std::get<2>(g);
    }
    check_close(dq, want.dq.narrow(2, 32, 16), tol, "dq");
    check_close(at::cat(dk, 2), want.dk, tol, "dk");
    check_close(at::cat(dv, 2), want.dv, tol, "dv");
    // A past block written as causal with its offset is the unmasked block (its first query
    // already sees its last key): the same kernel, the same bits.
    const at::Tensor k2 = kd.narrow(2, 16, 16), v2 = vd.narrow(2, 16, 16);
    const AttentionBlockResult as_causal = attention_block_forward(q3, k2, v2, true, std::nullopt, window, 16);
    const AttentionBlockResult as_past = attention_block_forward(q3, k2, v2, false, std::nullopt, window, 16);
    CHECK(at::equal(as_causal.out, as_past.out));
    CHECK(at::equal(as_causal.lse, as_past.lse));
  }
}

TEST_CASE("masks that mask nothing more in a block run today's kernels, bit for bit", "[attention]") {
  at::manual_seed(43);
  const at::Tensor q = at::randn({1, 4, 40, 32}), k = at::randn({1, 2, 40, 32}), v = at::randn({1, 2, 40, 32});
  const at::Tensor dout = at::randn({1, 4, 40, 32});
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO(name_of(dtype));
    const at::Tensor qd = q.to(dtype), kd = k.to(dtype), vd = v.to(dtype), gd = dout.to(dtype);
    auto same = [&](bool causal, int64_t window, int64_t key_offset, bool causal_today) {
      const AttentionBlockResult today = attention_block_forward(qd, kd, vd, causal_today);
      const AttentionBlockResult got = attention_block_forward(qd, kd, vd, causal, std::nullopt, window, key_offset);
      CHECK(at::equal(got.out, today.out));
      CHECK(at::equal(got.lse, today.lse));
      auto g_today = attention_block_backward(gd, qd, kd, vd, today.out, today.lse, causal_today);
      auto g = attention_block_backward(gd, qd, kd, vd, today.out, today.lse, causal, std::nullopt, window, key_offset);
      CHECK(at::equal(std::get<0>(g), std::get<0>(g_today)));
      CHECK(at::equal(std::get<1>(g), std::get<1>(g_today)));
      CHECK(at::equal(std::get<2>(g), std::get<2>(g_today)));
    };
    same(true, 40, 0, true);     // a window as long as the block: the causal square
    same(true, 1000, 0, true);
    same(false, 0, 7, false);    // no mask: the offset means nothing
    same(true, 0, 39, false);    // the first query sees the last key: no mask
    same(false, 50, 10, false);  // the farthest pair (39 + 10 - 0) inside the window
  }
}

TEST_CASE("attention blocks name a negative window", "[attention]") {
  const at::Tensor q = at::randn({1, 1, 4, 8}), k = at::randn({1, 1, 4, 8}), v = at::randn({1, 1, 4, 8});
  CHECK_THROWS_WITH(attention_block_forward(q, k, v, true, std::nullopt, -1),
                    Catch::Contains("window must be >= 0 keys (0: none), got -1"));
  CHECK_THROWS_WITH(attention_block_backward_math(q, q, k, v, q, at::zeros({1, 1, 4}), true, std::nullopt, -3),
                    Catch::Contains("got -3"));
}

TEST_CASE("CUDA: windowed attention blocks through the flash kernels equal the explicit-softmax form",
          "[attention][cuda]") {
  // Note [Banded attention masks]: the flash kernels take a window aligned bottom-right, so a
  // square causal window (offset 0) and the last queries of a sequence against all of its keys
  // (offset Sk - Sq) reach them; a past block with its own offset takes the math form on the
  // GPU too. bf16 operands, the math form on the CPU in float32 on the same values; flash rounds
  // P, dS and the output to bf16 (2^-8) before its GEMMs, ~4 roundings along a gradient's chain:
  // within 2^-5 of the largest value, as the unmasked CUDA case's bound.
  at::manual_seed(47);
  struct Mask {
    int64_t q_len, kv_len;
    bool causal;
    int64_t window, key_offset;
  };
  const std::vector<Mask> masks = {{256, 256, true, 64, 0}, {128, 256, true, 64, 128}, {128, 256, false, 64, 128},
                                   {128, 128, false, 32, 128}};
  for (const Mask& m : masks) {
    INFO("Sq " << m.q_len << " Sk " << m.kv_len << (m.causal ? " causal" : "") << " window " << m.window
               << " key_offset " << m.key_offset);
    const at::Tensor q = at::randn({1, 4, m.q_len, 64}), k = at::randn({1, 2, m.kv_len, 64}),
                     v = at::randn({1, 2, m.kv_len, 64}), dout = at::randn({1, 4, m.q_len, 64});
    auto bf = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kCUDA); };
    auto up = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); };
    const auto got = attention_block_forward(bf(q), bf(k), bf(v), m.causal, std::nullopt, m.window, m.key_offset);
    const auto want = attention_block_forward_math(up(q), up(k), up(v), m.causal, std::nullopt, m.window, m.key_offset);
    auto g = attention_block_backward(bf(dout), bf(q), bf(k), bf(v), got.out, got.lse, m.causal, std::nullopt, m.window,
                                      m.key_offset);
    auto w = attention_block_backward_math(up(dout), up(q), up(k), up(v), want.out, want.lse, m.causal, std::nullopt,
                                           m.window, m.key_offset);
    check_close(got.out.to(at::kCPU), want.out.to(at::kDouble), 1.0 / 32, "out");
    check_close(got.lse.to(at::kCPU), want.lse.to(at::kDouble), 1.0 / 32, "lse");
    check_close(std::get<0>(g).to(at::kCPU), std::get<0>(w).to(at::kDouble), 1.0 / 32, "dq");
    check_close(std::get<1>(g).to(at::kCPU), std::get<1>(w).to(at::kDouble), 1.0 / 32, "dk");
    check_close(std::get<2>(g).to(at::kCPU), std::get<2>(w).to(at::kDouble), 1.0 / 32, "dv");
  }
}
