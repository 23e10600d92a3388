// Attention with sinks, sliding windows and documents (model/sink_attention.h) against a float64
// softmax with the sink as one more column under the dense mask written element by element:
// query i of a row sees key j iff j <= i, both in the same document, and i - j < window (window
// 0: none), and every query's softmax has the extra logit s_h with no value. Forward and the
// gradients of q, k, v and the sinks, through autograd on both sides.
//
// Tolerances: float32 inputs through the CPU kernels (LibTorch's flash kernel per document,
// the sinks' logaddexp and rescale in float32) against float64 on the same inputs: each result is
// a float32 sum of at most S x hd (here 40 x 16) rounded products, a few hundred u = 2^-24 of the
// largest term at worst, so 1e-5 of the largest magnitude holds with a wide margin; a sink
// applied as a value, a window one key off or a document leak is off by O(0.1). bfloat16 inputs
// (titan's bf16 kernel): outputs and gradients rounded to bf16, P and dS rounded before their
// products, over at most 40 keys: 1e-2 of the largest magnitude (the kernels' own tests measure
// up to 2e-3).
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <vector>

#include "model/document_attention.h"
#include "model/sink_attention.h"
#include "tests/attention_reference.h"

using namespace titan::model;
using titan::testing::check_close;
using titan::testing::relative_tolerance;

namespace {

// The float64 dense reference: [B, H, S, v_hd].
at::Tensor dense_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& doc_ids,
                           int64_t window, const at::Tensor& sinks, double scale) {
  const int64_t B = q.size(0), H = q.size(1), S = q.size(2);
  const at::Tensor kk = titan::testing::repeat_heads(k, H), vv = titan::testing::repeat_heads(v, H);
  at::Tensor scores = at::matmul(q, kk.transpose(-1, -2)) * scale;  // [B, H, S, S]
  at::Tensor hidden = at::zeros({B, 1, S, S}, at::kBool);
  auto h = hidden.accessor<bool, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = 0; j < S; ++j) {
        const bool same_doc = !doc_ids.defined() || doc_ids[b][i].item<int64_t>() == doc_ids[b][j].item<int64_t>();
        h[b][0][i][j] = !(j <= i && same_doc && (window == 0 || i - j < window));
      }
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  if (sinks.defined()) {
    const at::Tensor column = sinks.view({1, H, 1, 1}).expand({B, H, S, 1});
    const at::Tensor p = at::softmax(at::cat({scores, column}, -1), -1);
    return at::matmul(p.narrow(-1, 0, S), vv);
  }
  return at::matmul(at::softmax(scores, -1), vv);
}

struct Case {
  at::ScalarType dtype;
  int64_t window;
  bool documents, sinks;
};

void check_case(const Case& c) {
  INFO("dtype " << c10::toString(c.dtype) << ", window " << c.window << ", documents " << c.documents << ", sinks "
                << c.sinks);
  const int64_t B = 2, H = 4, KV = 2, S = 40, hd = 16;
  const double scale = 0.3;  // not 1 / sqrt(hd): the caller's scale reaches the kernels
  at::manual_seed(7);
  const at::Tensor q64 = at::randn({B, H, S, hd}, at::kDouble), k64 = at::randn({B, KV, S, hd}, at::kDouble);
  const at::Tensor v64 = at::randn({B, KV, S, hd}, at::kDouble);
  // Sinks around the rows' lse (~log of the keys seen): each matters, none dominates.
  const at::Tensor s64 = at::tensor(std::vector<double>{0.5, 2.0, -1.0, 3.0});
  // Row 0: documents of 7, 20 and 13 tokens (EOS = 1 ends one); row 1 one document.
  std::vector<int64_t> tokens(B * S, 5);
  tokens[6] = tokens[26] = 1;
  const at::Tensor doc_ids = document_ids(at::tensor(tokens).view({B, S}), 1);
  const at::Tensor ids = c.documents ? doc_ids : at::Tensor();

  const at::Tensor q = q64.to(c.dtype).requires_grad_(true), k = k64.to(c.dtype).requires_grad_(true);
  const at::Tensor v = v64.to(c.dtype).requires_grad_(true);
  const at::Tensor sinks = c.sinks ? s64.to(at::kFloat).requires_grad_(true) : at::Tensor();
  const at::Tensor out = sink_attention(q, k, v, ids, c.window, sinks, scale);
  const at::Tensor dout = at::randn(out.sizes(), at::kDouble);
  torch::autograd::backward({out}, {dout.to(c.dtype)});

  // The reference on the rounded inputs (what the kernels saw).
  const at::Tensor rq = q.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor rk = k.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor rv = v.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor rs = c.sinks ? s64.to(at::kFloat).to(at::kDouble).requires_grad_(true) : at::Tensor();
  const at::Tensor want = dense_reference(rq, rk, rv, ids, c.window, rs, scale);
  torch::autograd::backward({want}, {dout});

  const double tol = relative_tolerance(c.dtype);
  check_close(out, want.detach(), tol, "out");
  if (c.window == 1 && !c.sinks) {
    // Each query sees itself alone: p = 1, so dS = p (dP - rowsum(dout out)) = dP - dP = 0 and dq,
    // dk are exactly zero; the kernels' float32 rounding leaves a few u of dP's terms (|dout| |v|
    // scale |k| <= ~100 here; bf16 computes dS from float32 accumulators too): 1e-5 absolute.
    CHECK(rq.grad().abs().max().item<double>() == 0.0);
    CHECK(q.grad().abs().max().item<double>() < 1e-5);
    CHECK(k.grad().abs().max().item<double>() < 1e-5);
  } else {
    check_close(q.grad(), rq.grad(), tol, "dq");
    check_close(k.grad(), rk.grad(), tol, "dk");
  }
  check_close(v.grad(), rv.grad(), tol, "dv");
  if (c.sinks) {
    // ds_h = -sum over rows of p_sink rowsum(dout out): a float32 sum of B x S products of
    // float32-accurate factors, within 1e-5 (bf16: 1e-2) of the largest such sum's magnitude.
    check_close(sinks.grad(), rs.grad(), tol, "dsinks");
    CHECK(rs.grad().abs().min().item<double>() > 1e-3);  // every sink's gradient is there to compare
  }
}

}  // namespace

TEST_CASE("sink attention: sinks, sliding windows and documents equal a float64 softmax with a sink column under the "
          "dense mask, forward and backward",
          "[model][attention][sinks]") {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (int64_t window : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{64}})  // 64: longer than the rows
      for (bool documents : {false, true})
        for (bool sinks : {false, true}) check_case({dtype, window, documents, sinks});
}

TEST_CASE("sink attention: a sink of -inf is attention without sinks; bad shapes are named", "[model][attention][sinks]") {
  at::manual_seed(3);
  const at::Tensor q = at::randn({1, 2, 9, 8}), k = at::randn({1, 1, 9, 8}), v = at::randn({1, 1, 9, 8});
  const at::Tensor none = sink_attention(q, k, v, at::Tensor(), 4, at::Tensor());
  const at::Tensor minus_inf = sink_attention(q, k, v, at::Tensor(), 4, at::full({2}, -INFINITY));
  CHECK(at::equal(none, minus_inf));
  CHECK_THROWS_WITH(sink_attention(q, k, v, at::Tensor(), 4, at::zeros({3})), Catch::Contains("one sink per head"));
  CHECK_THROWS_WITH(sink_attention(q, k, v, at::Tensor(), -1, at::Tensor()), Catch::Contains("sliding window"));
  CHECK_THROWS_WITH(sink_attention(q, k, v, at::zeros({1, 5}, at::kLong), 0, at::Tensor()),
                    Catch::Contains("documents [B, S]"));
}
