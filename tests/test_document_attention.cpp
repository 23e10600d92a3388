// Block-causal attention's kernel layer (model/document_attention.h): documents found from EOS as
// torchtitan finds them, and attention confined to each document. What must hold exactly: a
// document's attention output and gradients in a packed row are bit for bit those of the same
// document run alone (the same kernel on the same values: nothing to tolerate), and a batch of
// single-document rows is the causal attention itself. Against a dense masked softmax in float64
// the float32 result differs only by rounding: |error| <= 64 u max|v| (u = 2^-24; the softmax
// weights sum to 1, so the output is a convex combination of v rows whose float32 evaluation
// (the scores' dot products over hd = 16, the exp, the sum over at most S = 24 keys) loses a few
// dozen roundings of max|v| at most). Also: context parallelism's attention blocks on CUDA
// (model/attention_blocks.h) against their explicit-softmax form.
#include <ATen/ops/abs.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
#include <torch/csrc/autograd/autograd.h>

#include <catch2/catch.hpp>
#include <limits>
#include <optional>
#include <vector>

#include "model/activation_checkpoint_ops.h"
#include "model/attention_blocks.h"
#include "model/document_attention.h"

using namespace titan::model;

namespace {

constexpr int64_t kEos = 9;

at::Tensor tokens_of(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), -1});
}

std::vector<int64_t> as_vector(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// float64 reference: softmax over keys j <= i with doc[j] == doc[i]; `scale` unset: 1 / sqrt(hd).
at::Tensor dense_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& doc,
                           std::optional<double> scale = std::nullopt) {
  const at::Tensor qd = q.to(at::kDouble), kd = k.to(at::kDouble), vd = v.to(at::kDouble);
  const int64_t S = q.size(2);
  at::Tensor scores =
      qd.matmul(kd.transpose(-2, -1)) * scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));  // [B, H, S, S]
  const at::Tensor pos = at::arange(S, at::kLong);
  const at::Tensor causal = pos.unsqueeze(1).ge(pos.unsqueeze(0));                  // [S, S]
  const at::Tensor same = doc.unsqueeze(2).eq(doc.unsqueeze(1));                    // [B, S, S]
  const at::Tensor allowed = same.logical_and(causal.unsqueeze(0)).unsqueeze(1);    // [B, 1, S, S]
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  return at::softmax(scores, -1).matmul(vd);
}

}  // namespace

TEST_CASE("document ids follow torchtitan: an EOS closes its document, the next token opens one", "[model][documents]") {
  const at::Tensor ids = document_ids(tokens_of({{1, 2, kEos, 3, kEos, 4}, {kEos, 5, 6, 7, 8, kEos}, {1, 2, 3, 4, 5, 6}}), kEos);
  CHECK(as_vector(ids) == std::vector<int64_t>{0, 0, 0, 1, 1, 2, /**/ 0, 1, 1, 1, 1, 1, /**/ 0, 0, 0, 0, 0, 0});
  CHECK(as_vector(document_ids(tokens_of({{kEos}}), kEos)) == std::vector<int64_t>{0});  // a row that is one EOS
  const auto spans = document_spans(ids);
  REQUIRE(spans.size() == 3);
  REQUIRE(spans[0].size() == 3);
  CHECK((spans[0][1].start == 3 && spans[0][1].length == 2));
  CHECK((spans[1].size() == 2 && spans[1][0].length == 1 && spans[1][1].length == 5));
  CHECK(spans[2].size() == 1);  // no EOS: one document
  CHECK_THROWS_WITH(document_spans(at::tensor(std::vector<int64_t>{0, 1, 0}, at::kLong).view({1, 3})),
                    Catch::Contains("must not decrease"));
}

TEST_CASE("document-masked attention: each packed document equals the document alone, bit for bit",
          "[model][documents]") {
  at::manual_seed(3);
  const int64_t B = 2, H = 4, KV = 2, S = 24, hd = 16;
  // Row 0: documents of 7, 1 (a lone EOS), 10 and 6 tokens; row 1: documents of 12 and 12.
  std::vector<int64_t> row0(S, 1), row1(S, 1);
  row0[6] = row0[7] = row0[17] = kEos;
  row1[11] = kEos;
  const at::Tensor doc = document_ids(tokens_of({row0, row1}), kEos);
  const auto spans = document_spans(doc);
  REQUIRE(spans[0].size() == 4);
  // The work done: row 0 (7*8 + 1*2 + 10*11 + 6*7) / (24*25) = 0.35, row 1 2*12*13/600 = 0.52.
  CHECK(attention_work_fraction(doc) == Approx((0.35 + 0.52) / 2).epsilon(1e-12));
  CHECK(attention_work_fraction(document_ids(tokens_of({{1, 2, 3}}), kEos)) == 1.0);
  at::Tensor q = at::randn({B, H, S, hd}).requires_grad_(true);
  at::Tensor k = at::randn({B, KV, S, hd}).requires_grad_(true);
  at::Tensor v = at::randn({B, KV, S, hd}).requires_grad_(true);
  const at::Tensor g = at::randn({B, H, S, hd});
  const at::Tensor out = document_causal_attention(q, k, v, doc);
  torch::autograd::backward({out}, {g});
  for (int64_t b = 0; b < B; ++b)
    for (const DocumentSpan& d : spans[static_cast<size_t>(b)]) {
      INFO("row " << b << ", document at " << d.start << " of length " << d.length);
      auto part = [&](const at::Tensor& t) { return t.narrow(0, b, 1).narrow(2, d.start, d.length); };
      at::Tensor qa = part(q).detach().contiguous().requires_grad_(true);
      at::Tensor ka = part(k).detach().contiguous().requires_grad_(true);
      at::Tensor va = part(v).detach().contiguous().requires_grad_(true);
      const at::Tensor alone = attention_op(qa, ka, va);
      torch::autograd::backward({alone}, {part(g).contiguous()});
      CHECK(at::equal(part(out), alone));
      CHECK(at::equal(part(q.grad()), qa.grad()));
      CHECK(at::equal(part(k.grad()), ka.grad()));
      CHECK(at::equal(part(v.grad()), va.grad()));
    }
  // Against the dense masked softmax in float64 (the bound in the header comment).
  const double bound = 64.0 / (1 << 24) * at::abs(v).max().item<double>();
  const double error = at::abs(out.detach().to(at::kDouble) - dense_reference(q.detach(), k.detach().repeat_interleave(H / KV, 1),
                                                                              v.detach().repeat_interleave(H / KV, 1), doc))
                           .max()
                           .item<double>();
  INFO("max |error| vs float64 " << error << ", bound " << bound);
  CHECK(error <= bound);
}

TEST_CASE("document-masked attention on single-document rows is the causal attention, bit for bit",
          "[model][documents]") {
  at::manual_seed(4);
  const at::Tensor q = at::randn({2, 4, 16, 8}), k = at::randn({2, 2, 16, 8}), v = at::randn({2, 2, 16, 8});
  std::vector<int64_t> row(16, 1);
  row[15] = kEos;  // EOS as the last token closes the row's only document
  const at::Tensor doc = document_ids(tokens_of({row, std::vector<int64_t>(16, 2)}), kEos);
  CHECK(at::equal(document_causal_attention(q, k, v, doc), attention_op(q, k, v)));
}

TEST_CASE("CUDA: variable-length flash attention over packed documents equals the CPU per-document form",
          "[model][documents][cuda]") {
  // bfloat16 on the GPU (the varlen kernel's dtype) against the CPU per-document form in float32
  // on the very same bf16 values. Tolerances from bf16's unit roundoff u = 2^-8 relative: the
  // output is a convex combination of v rows, and the kernel rounds the softmax weights to bf16
  // before P V (<= u/2 max|v|) and the output to bf16 (<= u/2 max|v|): |error| <= u max|v|, bound
  // 2u max|v|. The gradients go through two more bf16-rounded products (dP = dO V^T and dS): a
  // few u of the largest gradient; bound 4u max|g|.
  at::manual_seed(5);
  const int64_t B = 2, H = 8, KV = 2, S = 256, hd = 64;
  // Row 0: documents of 1, 100, 37 and 118 tokens (EOS last); row 1: 200 then an open tail of 56.
  std::vector<int64_t> row0(S, 1), row1(S, 1);
  for (int64_t at_eos : {0, 100, 137, 255}) row0[static_cast<size_t>(at_eos)] = kEos;
  row1[199] = kEos;
  const at::Tensor doc = document_ids(tokens_of({row0, row1}), kEos);
  const auto cuda = at::TensorOptions().device(c10::kCUDA).dtype(at::kBFloat16);
  const at::Tensor q0 = at::randn({B, H, S, hd}).to(at::kBFloat16), k0 = at::randn({B, KV, S, hd}).to(at::kBFloat16);
  const at::Tensor v0 = at::randn({B, KV, S, hd}).to(at::kBFloat16), g0 = at::randn({B, H, S, hd}).to(at::kBFloat16);
  at::Tensor qg = q0.to(cuda).requires_grad_(true), kg = k0.to(cuda).requires_grad_(true), vg = v0.to(cuda).requires_grad_(true);
  const at::Tensor out_gpu = document_causal_attention(qg, kg, vg, doc.to(c10::kCUDA));
  torch::autograd::backward({out_gpu}, {g0.to(cuda)});
  at::Tensor qc = q0.to(at::kFloat).requires_grad_(true), kc = k0.to(at::kFloat).requires_grad_(true),
             vc = v0.to(at::kFloat).requires_grad_(true);
  const at::Tensor out_cpu = document_causal_attention(qc, kc, vc, doc);
  torch::autograd::backward({out_cpu}, {g0.to(at::kFloat)});
  const double u = 1.0 / 256;
  auto error = [](const at::Tensor& got, const at::Tensor& want) {
    return at::abs(got.cpu().to(at::kFloat) - want).max().item<double>();
  };
  auto largest = [](const at::Tensor& t) { return at::abs(t).max().item<double>(); };
  CHECK(error(out_gpu, out_cpu) <= 2 * u * largest(vc));
  CHECK(error(qg.grad(), qc.grad()) <= 4 * u * largest(qc.grad()));
  CHECK(error(kg.grad(), kc.grad()) <= 4 * u * largest(kc.grad()));
  CHECK(error(vg.grad(), vc.grad()) <= 4 * u * largest(vc.grad()));
}

TEST_CASE("CUDA: attention blocks through the flash kernels equal the explicit-softmax form", "[model][cp][cuda]") {
  // Note [Attention blocks on CUDA]: bf16 operands (the same values upcast for the reference,
  // the math form in float32 on the CPU). A past block and the causal diagonal merged, then each
  // block's backward from the merged (out, lse). The flash kernels round P, dS and the output to
  // bf16 (unit roundoff 2^-8) before their GEMMs; with ~4 such roundings along a gradient's
  // chain the error stays below ~4 x 2^-8 of the largest value: bound 2^-5 of it.
  at::manual_seed(11);
  const at::Tensor q = at::randn({2, 4, 256, 64}), k = at::randn({2, 2, 256, 64}), v = at::randn({2, 2, 256, 64});
  const at::Tensor dout = at::randn({2, 4, 128, 64});
  auto max_abs_diff = [](const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); };
  auto bf = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kCUDA); };
  auto up = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); };
  auto within = [&](const at::Tensor& got, const at::Tensor& want) {
    return max_abs_diff(got.to(at::kCPU).to(at::kFloat), want) <= want.abs().max().item<double>() / 32;
  };
  const at::Tensor q2 = q.narrow(2, 128, 128);
  auto run = [&](auto to, auto fwd, auto bwd) {
    at::Tensor out = at::zeros({2, 4, 128, 64}).to(to(q2).device()), lse = at::full({2, 4, 128}, -INFINITY).to(out.device());
    const std::optional<double> scale;  // the default, 1 / sqrt(hd)
    const at::Tensor k_past = to(k.narrow(2, 0, 128)), v_past = to(v.narrow(2, 0, 128));
    const at::Tensor k_diag = to(k.narrow(2, 128, 128)), v_diag = to(v.narrow(2, 128, 128));
    merge_attention_block(out, lse, fwd(to(q2), k_past, v_past, false, scale, 0, 0));
    merge_attention_block(out, lse, fwd(to(q2), k_diag, v_diag, true, scale, 0, 0));
    auto past = bwd(to(dout), to(q2), k_past, v_past, out, lse, false, scale, 0, 0);
    auto diag = bwd(to(dout), to(q2), k_diag, v_diag, out, lse, true, scale, 0, 0);
    return std::vector<at::Tensor>{out, lse, std::get<0>(past) + std::get<0>(diag), std::get<1>(past),
                                   std::get<2>(past), std::get<1>(diag), std::get<2>(diag)};
  };
  const auto got = run(bf, attention_block_forward, attention_block_backward);
  const auto want = run(up, attention_block_forward_math, attention_block_backward_math);
  const char* names[] = {"out", "lse", "dq", "dk past", "dv past", "dk diagonal", "dv diagonal"};
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(names[i]);
    CHECK(within(got[i], want[i]));
  }
}

TEST_CASE("document-masked attention takes a v head size other than q/k's and an explicit scale",
          "[model][documents]") {
  // q/k head 48, v head 32, scale 0.7 / sqrt(48) (Note [Attention head sizes and scale] in
  // model/kernels/attention.h). Exact: each packed document is the document alone, bit for bit.
  // Against the dense masked softmax in float64 (its gradients by autograd): float32 sums of at
  // most 24 keys x 48 products, a few dozen u = 2^-24 of the largest magnitude at worst, within
  // 1e-5 of it; bf16 rounds the output and gradients (2^-9 relative) and, in LibTorch's kernel or
  // bf16 dot products, P and dS before their products (2^-8 of each term): within 1e-2 of it.
  at::manual_seed(8);
  const int64_t B = 2, H = 4, KV = 2, S = 24, qk_hd = 48, v_hd = 32;
  const double scale = 0.7 / std::sqrt(48.0);
  std::vector<int64_t> row0(S, 1), row1(S, 1);
  row0[6] = row0[7] = row0[17] = kEos;  // documents of 7, 1, 10 and 6 tokens
  row1[11] = kEos;                      // 12 and 12
  const at::Tensor doc = document_ids(tokens_of({row0, row1}), kEos);
  const auto spans = document_spans(doc);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO((dtype == at::kFloat ? "float32" : "bfloat16"));
    at::Tensor q = at::randn({B, H, S, qk_hd}).to(dtype).requires_grad_(true);
    at::Tensor k = at::randn({B, KV, S, qk_hd}).to(dtype).requires_grad_(true);
    at::Tensor v = at::randn({B, KV, S, v_hd}).to(dtype).requires_grad_(true);
    const at::Tensor g = at::randn({B, H, S, v_hd}).to(dtype);
    const at::Tensor out = document_causal_attention(q, k, v, doc, scale);
    REQUIRE(out.sizes() == at::IntArrayRef({B, H, S, v_hd}));
    torch::autograd::backward({out}, {g});
    for (int64_t b = 0; b < B; ++b)
      for (const DocumentSpan& d : spans[static_cast<size_t>(b)]) {
        INFO("row " << b << ", document at " << d.start << " of length " << d.length);
        auto part = [&](const at::Tensor& t) { return t.narrow(0, b, 1).narrow(2, d.start, d.length); };
        at::Tensor qa = part(q).detach().contiguous().requires_grad_(true);
        at::Tensor ka = part(k).detach().contiguous().requires_grad_(true);
        at::Tensor va = part(v).detach().contiguous().requires_grad_(true);
        const at::Tensor alone = attention_op(qa, ka, va, scale);
        torch::autograd::backward({alone}, {part(g).contiguous()});
        CHECK(at::equal(part(out), alone));
        CHECK(at::equal(part(q.grad()), qa.grad()));
        CHECK(at::equal(part(k.grad()), ka.grad()));
        CHECK(at::equal(part(v.grad()), va.grad()));
      }
    at::Tensor q64 = q.detach().to(at::kDouble).requires_grad_(true);
    at::Tensor k64 = k.detach().to(at::kDouble).requires_grad_(true);
    at::Tensor v64 = v.detach().to(at::kDouble).requires_grad_(true);
    const at::Tensor want = dense_reference(q64, k64.repeat_interleave(H / KV, 1), v64.repeat_interleave(H / KV, 1), doc, scale);
    torch::autograd::backward({want}, {g.to(at::kDouble)});
    const double relative = dtype == at::kFloat ? 1e-5 : 1e-2;
    auto check_close = [&](const at::Tensor& got, const at::Tensor& expected, const char* what) {
      const double error = at::abs(got.detach().to(at::kDouble) - expected.detach()).max().item<double>();
      const double largest = at::abs(expected.detach()).max().item<double>();
      INFO(what << ": max |error| vs float64 " << error << ", largest " << largest);
      CHECK(error <= relative * largest);
    };
    check_close(out, want, "out");
    check_close(q.grad(), q64.grad(), "dq");
    check_close(k.grad(), k64.grad(), "dk");
    check_close(v.grad(), v64.grad(), "dv");
  }
}

TEST_CASE("CUDA: the flash kernels take a v head size other than q/k's (padded) and an explicit scale",
          "[model][documents][cp][cuda]") {
  // q/k head 48, v head 32, scale 0.7 / sqrt(48): LibTorch's flash kernels take one head size, so
  // v goes in zero-padded to 48 and the output comes back sliced (Note [Equal head sizes for
  // LibTorch's flash kernels] in model/attention_blocks.h). The bounds and their reasons are
  // those of the two CUDA cases above: the varlen documents against the CPU per-document form in
  // float32 on the same bf16 values (2u max|v| for the output, 4u of the largest gradient), the
  // blocks against their explicit-softmax form (2^-5 of the largest value).
  at::manual_seed(12);
  const int64_t B = 2, H = 4, KV = 2, S = 128, qk_hd = 48, v_hd = 32;
  const double scale = 0.7 / std::sqrt(48.0), u = 1.0 / 256;
  std::vector<int64_t> row0(S, 1), row1(S, 1);
  for (int64_t at_eos : {40, 41, 100}) row0[static_cast<size_t>(at_eos)] = kEos;
  row1[63] = kEos;
  const at::Tensor doc = document_ids(tokens_of({row0, row1}), kEos);
  const auto cuda = at::TensorOptions().device(c10::kCUDA).dtype(at::kBFloat16);
  const at::Tensor q0 = at::randn({B, H, S, qk_hd}).to(at::kBFloat16), k0 = at::randn({B, KV, S, qk_hd}).to(at::kBFloat16);
  const at::Tensor v0 = at::randn({B, KV, S, v_hd}).to(at::kBFloat16), g0 = at::randn({B, H, S, v_hd}).to(at::kBFloat16);
  auto largest = [](const at::Tensor& t) { return at::abs(t.cpu().to(at::kFloat)).max().item<double>(); };
  auto error = [](const at::Tensor& got, const at::Tensor& want) {
    return at::abs(got.cpu().to(at::kFloat) - want.cpu().to(at::kFloat)).max().item<double>();
  };
  {
    INFO("variable-length documents");
    at::Tensor qg = q0.to(cuda).requires_grad_(true), kg = k0.to(cuda).requires_grad_(true),
               vg = v0.to(cuda).requires_grad_(true);
    const at::Tensor out_gpu = document_causal_attention(qg, kg, vg, doc.to(c10::kCUDA), scale);
    REQUIRE(out_gpu.size(3) == v_hd);
    torch::autograd::backward({out_gpu}, {g0.to(cuda)});
    at::Tensor qc = q0.to(at::kFloat).requires_grad_(true), kc = k0.to(at::kFloat).requires_grad_(true),
               vc = v0.to(at::kFloat).requires_grad_(true);
    const at::Tensor out_cpu = document_causal_attention(qc, kc, vc, doc, scale);
    torch::autograd::backward({out_cpu}, {g0.to(at::kFloat)});
    CHECK(error(out_gpu, out_cpu) <= 2 * u * largest(vc));
    CHECK(error(qg.grad(), qc.grad()) <= 4 * u * largest(qc.grad()));
    CHECK(error(kg.grad(), kc.grad()) <= 4 * u * largest(kc.grad()));
    CHECK(error(vg.grad(), vc.grad()) <= 4 * u * largest(vc.grad()));
  }
  {
    INFO("attention blocks");
    const at::Tensor q2 = q0.narrow(2, 64, 64), dout = g0.narrow(2, 64, 64);
    auto run = [&](const at::TensorOptions& to, bool flash) {
      auto fwd = flash ? attention_block_forward : attention_block_forward_math;
      auto bwd = flash ? attention_block_backward : attention_block_backward_math;
      auto on = [&](const at::Tensor& t) { return t.to(to); };
      at::Tensor out = at::zeros({B, H, 64, v_hd}, to.dtype(at::kFloat)), lse = at::full({B, H, 64}, -INFINITY, out.options());
      const at::Tensor k_past = on(k0.narrow(2, 0, 64)), v_past = on(v0.narrow(2, 0, 64));
      const at::Tensor k_diag = on(k0.narrow(2, 64, 64)), v_diag = on(v0.narrow(2, 64, 64));
      merge_attention_block(out, lse, fwd(on(q2), k_past, v_past, false, scale, 0, 0));
      merge_attention_block(out, lse, fwd(on(q2), k_diag, v_diag, true, scale, 0, 0));
      auto past = bwd(on(dout), on(q2), k_past, v_past, out, lse, false, scale, 0, 0);
      auto diag = bwd(on(dout), on(q2), k_diag, v_diag, out, lse, true, scale, 0, 0);
      return std::vector<at::Tensor>{out, lse, std::get<0>(past) + std::get<0>(diag), std::get<1>(past),
                                     std::get<2>(past), std::get<1>(diag), std::get<2>(diag)};
    };
    const auto got = run(cuda, true);
    const auto want = run(at::TensorOptions().dtype(at::kFloat), false);
    const char* names[] = {"out", "lse", "dq", "dk past", "dv past", "dk diagonal", "dv diagonal"};
    for (size_t i = 0; i < got.size(); ++i) {
      INFO(names[i]);
      CHECK(got[i].sizes() == want[i].sizes());
      CHECK(error(got[i], want[i]) <= largest(want[i]) / 32);
    }
  }
}

TEST_CASE("the attention work of a sliding window: each query's pairs capped at the window", "[model][attention]") {
  // Row 0: documents of 6 and 6 positions; row 1: one of 12. Of the causal square's 12 x 13 pairs,
  // a window of 4 leaves 4 x 5 / 2 + 4 (n - 4) per document of n: 18 for each of row 0's, 42 for
  // row 1's; a window at least as long as every document is the causal count.
  const at::Tensor docs = at::tensor(std::vector<int64_t>{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0,
                                                          0, 0, 0, 0, 0})
                              .view({2, 12});
  const double square = 12.0 * 13.0 / 2;
  CHECK(attention_work_fraction(docs, 4) == Approx(((18.0 + 18.0) / square + 42.0 / square) / 2).epsilon(1e-12));
  CHECK(attention_work_fraction(docs, 12) == attention_work_fraction(docs));
  CHECK(attention_work_fraction(docs, 0) == attention_work_fraction(docs));
}
