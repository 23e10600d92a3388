// Expert parallelism's exchange (parallel/expert_parallel/expert_parallel.h) on threads standing
// in for ranks: every rank's routed rows through experts sharded over EP 2 and EP 4 against the
// same rows through all the experts on one rank, forward and backward, with uneven and empty
// groups; per-op AC's replay repeats no exchange.
//
// Tolerance: each row meets the same expert weights in both forms; only the GEMMs' row blocking
// (how many rows share one matmul call) differs, and an expert's weight gradient sums the ranks'
// rows in another order. float32 over 16-term dot products and <= 4 partial sums: a few ulps of
// O(1) values; the bound 1e-5 relative to the largest value is ~50x that, while a row sent to the
// wrong expert or rank is off by O(1).
#include <catch2/catch.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ops/equal.h>

#include "float8/grouped_experts.h"
#include "float8/scaling.h"
#include "model/activation_checkpoint_ops.h"
#include "parallel/comm/comm_trace.h"
#include "model/moe/moe.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/comm/process_group.h"
#include "parallel/expert_parallel/expert_parallel.h"
#include "tests/rank_threads.h"

namespace tp = titan::parallel;
namespace tmod = titan::model;
using Catch::Matchers::Contains;

namespace {

// SwiGLU experts holding the given (this rank's) stacked weights.
std::unique_ptr<tmod::moe::SwiGluExperts> swiglu_experts(const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3) {
  auto experts = std::make_unique<tmod::moe::SwiGluExperts>("layers.0.moe.experts", w1.size(0), w1.size(2), w1.size(1));
  experts->w1 = w1;
  experts->w2 = w2;
  experts->w3 = w3;
  return experts;
}
tmod::moe::SwiGluExperts& swiglu(tmod::moe::MoE& layer) { return dynamic_cast<tmod::moe::SwiGluExperts&>(*layer.experts); }

constexpr int64_t kExperts = 8, kDim = 16, kHidden = 12;

at::Tensor normal(std::vector<int64_t> shape, uint64_t seed, double scale = 1.0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)) * scale;
}

// Rank r's rows per expert: uneven, some experts get none from some ranks.
std::vector<int64_t> counts_of(int rank) {
  std::vector<int64_t> c(static_cast<size_t>(kExperts));
  for (int64_t e = 0; e < kExperts; ++e) c[static_cast<size_t>(e)] = (e * 3 + rank * 5) % 4;  // 0..3
  return c;
}

int64_t total(const std::vector<int64_t>& c) {
  int64_t t = 0;
  for (int64_t n : c) t += n;
  return t;
}

double relative(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

}  // namespace

TEST_CASE("expert parallel dispatch, experts and combine over EP 2 and 4 equal all experts on one rank",
          "[parallel][moe]") {
  const at::Tensor w1 = normal({kExperts, kHidden, kDim}, 1, 0.3), w2 = normal({kExperts, kDim, kHidden}, 2, 0.3);
  const at::Tensor w3 = normal({kExperts, kHidden, kDim}, 3, 0.3);
  for (int n : {2, 4}) {
    INFO("EP " << n);
    // The reference: each rank's rows through every expert locally; the weight gradients summed
    // over the ranks (what each expert's shard must receive).
    std::vector<at::Tensor> want_out, want_drows;
    at::Tensor want_dw1 = at::zeros_like(w1), want_dw2 = at::zeros_like(w2), want_dw3 = at::zeros_like(w3);
    for (int r = 0; r < n; ++r) {
      at::Tensor rows = normal({total(counts_of(r)), kDim}, 100 + r).requires_grad_(true);
      at::Tensor a = w1.clone().requires_grad_(true), b = w2.clone().requires_grad_(true), c = w3.clone().requires_grad_(true);
      const at::Tensor out = tmod::moe::grouped_experts(rows, a, b, c, counts_of(r));
      torch::autograd::backward({out}, {normal(out.sizes().vec(), 200 + r)});
      want_out.push_back(out.detach());
      want_drows.push_back(rows.grad());
      want_dw1 += a.grad();
      want_dw2 += b.grad();
      want_dw3 += c.grad();
    }
    const auto errors = titan::testing::run_ranks_on_threads(
        n, std::chrono::seconds(60), [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
          tp::comm::CommOptions options;
          options.timeout = std::chrono::seconds(60);
          tp::comm::Comm ep(store, rank, n, "ep_" + std::to_string(n), options);
          const int64_t first = tp::expert_parallel::local_experts_begin(kExperts, n, rank), local = kExperts / n;
          auto shard = [&](const at::Tensor& w) { return w.narrow(0, first, local).clone().requires_grad_(true); };
          at::Tensor a = shard(w1), b = shard(w2), c = shard(w3);
          const auto experts_held = swiglu_experts(a, b, c);
          const tmod::moe::SwiGluExperts& experts = *experts_held;
          const std::vector<int64_t> counts = counts_of(rank);
          // Per-op AC's record (no grad) then replay: the replay must exchange nothing.
          tmod::OpCheckpointStore store_ops(tp::selective_ac_save_list());
          at::Tensor recorded;
          {
            at::NoGradGuard no_grad;
            tmod::OpCheckpointScope record(&store_ops, tmod::OpCheckpointPhase::kRecord);
            recorded = tp::expert_parallel::expert_parallel_experts(normal({total(counts), kDim}, 100 + rank), counts,
                                                                     experts, ep);
          }
          const uint64_t collectives = ep.sequence_number();
          at::Tensor rows = normal({total(counts), kDim}, 100 + rank).requires_grad_(true);
          at::Tensor out;
          {
            tmod::OpCheckpointScope replay(&store_ops, tmod::OpCheckpointPhase::kReplay);
            out = tp::expert_parallel::expert_parallel_experts(rows, counts, experts, ep);
          }
          if (ep.sequence_number() != collectives) throw std::runtime_error("the per-op AC replay communicated");
          torch::autograd::backward({out}, {normal(out.sizes().vec(), 200 + rank)});
          std::ostringstream bad;
          auto expect = [&](const at::Tensor& got, const at::Tensor& want, const char* what) {
            const double d = relative(got, want);
            if (!(d < 1e-5)) bad << what << " differs by " << d << " relative; ";
          };
          expect(out, want_out[static_cast<size_t>(rank)], "output");
          expect(rows.grad(), want_drows[static_cast<size_t>(rank)], "d rows");
          expect(a.grad(), want_dw1.narrow(0, first, local), "d w1");
          expect(b.grad(), want_dw2.narrow(0, first, local), "d w2");
          expect(c.grad(), want_dw3.narrow(0, first, local), "d w3");
          if (!bad.str().empty()) throw std::runtime_error(bad.str());
        });
    for (size_t r = 0; r < errors.size(); ++r)
      if (!errors[r].empty()) FAIL_CHECK("rank " << r << ": " << errors[r]);
  }
  CHECK_THROWS_WITH(tp::expert_parallel::local_experts_begin(8, 3, 0),
                    Contains("parallelism.expert_parallel_degree 3 does not divide the model's 8 experts"));
}

TEST_CASE("a whole MoE layer under EP 2 equals the layer with every expert on each rank", "[parallel][moe]") {
  // Qwen3-MoE's router (softmax, top 2, route_norm, score after experts) and one shared expert;
  // each rank its own tokens (the shared expert runs while the combine travels). The gate stays replicated: its gradient is each rank's own.
  tmod::moe::MoEArgs args;
  args.num_experts = kExperts;
  args.score_func = "softmax";
  args.top_k = 2;
  args.route_norm = true;
  args.score_before_experts = false;
  const int n = 2;
  auto build = [&](tmod::moe::MoE& layer, int64_t first, int64_t count) {
    auto leaf = [](const at::Tensor& t) { return t.clone().requires_grad_(true); };
    layer.gate.weight = leaf(normal({kExperts, kDim}, 4, 0.5));
    auto& experts = swiglu(layer);
    experts.w1 = leaf(normal({kExperts, kHidden, kDim}, 1, 0.3).narrow(0, first, count));
    experts.w2 = leaf(normal({kExperts, kDim, kHidden}, 2, 0.3).narrow(0, first, count));
    experts.w3 = leaf(normal({kExperts, kHidden, kDim}, 3, 0.3).narrow(0, first, count));
    layer.shared_w1->weight = leaf(normal({kHidden, kDim}, 5, 0.3));
    layer.shared_w2->weight = leaf(normal({kDim, kHidden}, 6, 0.3));
    layer.shared_w3->weight = leaf(normal({kHidden, kDim}, 7, 0.3));
    layer.expert_bias = at::zeros({kExperts});
    layer.tokens_per_expert = at::zeros({kExperts});
  };
  struct Want {
    at::Tensor out, dx, dgate, dw1;
  };
  std::vector<Want> want;
  at::Tensor dw1_sum = at::zeros({kExperts, kHidden, kDim});
  for (int r = 0; r < n; ++r) {
    tmod::moe::MoE layer("layers.0.moe", args, kDim, kHidden);
    build(layer, 0, kExperts);
    at::Tensor x = normal({2, 6, kDim}, 300 + r).requires_grad_(true);
    const at::Tensor out = layer.forward(x);
    torch::autograd::backward({out}, {normal({2, 6, kDim}, 400 + r)});
    want.push_back({out.detach(), x.grad(), layer.gate.weight.grad(), swiglu(layer).w1.grad()});
    dw1_sum += swiglu(layer).w1.grad();
  }
  const auto errors = titan::testing::run_ranks_on_threads(
      n, std::chrono::seconds(60), [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
        tp::comm::Comm ep(store, rank, n, "ep_layer");
        const int64_t local = kExperts / n, first = tp::expert_parallel::local_experts_begin(kExperts, n, rank);
        tmod::moe::MoE layer("layers.0.moe", args, kDim, kHidden);
        build(layer, first, local);
        tp::comm::Comm* comm = &ep;
        // The shared expert overlaps the combine: it runs after the combine was issued (the EP
        // group's 3rd collective: counts, dispatch, combine), and its weight gradient arrives
        // after the combine's gradient was issued (4th) and before the dispatch's (5th).
        uint64_t issued_when_shared_ran = 0, issued_when_shared_grad = 0;
        layer.experts_compute = [&, comm](const at::Tensor& rows, const std::vector<int64_t>& counts,
                                          const tmod::moe::RoutedExperts& experts,
                                          const tmod::moe::ExpertComputes&, const std::function<void()>& shared) {
          return tp::expert_parallel::expert_parallel_experts(rows, counts, experts, *comm, [&] {
            issued_when_shared_ran = comm->sequence_number();
            shared();
          });
        };
        layer.shared_w1->weight.register_hook([&](const at::Tensor& g) {
          issued_when_shared_grad = comm->sequence_number();
          return g;
        });
        at::Tensor x = normal({2, 6, kDim}, 300 + rank).requires_grad_(true);
        const at::Tensor out = layer.forward(x);
        torch::autograd::backward({out}, {normal({2, 6, kDim}, 400 + rank)});
        const Want& w = want[static_cast<size_t>(rank)];
        std::ostringstream bad;
        if (issued_when_shared_ran != 3 || issued_when_shared_grad != 4 || comm->sequence_number() != 5)
          bad << "shared expert not overlapped with the combine: it ran after collective " << issued_when_shared_ran
              << " (want 3), its gradient after " << issued_when_shared_grad << " (want 4) of "
              << comm->sequence_number() << " (want 5); ";
        auto expect = [&](const at::Tensor& got, const at::Tensor& ref, const char* what) {
          const double d = relative(got, ref);
          if (!(d < 1e-5)) bad << what << " differs by " << d << " relative; ";
        };
        expect(out, w.out, "output");
        expect(x.grad(), w.dx, "d x");
        expect(layer.gate.weight.grad(), w.dgate, "d gate");
        expect(swiglu(layer).w1.grad(), dw1_sum.narrow(0, first, local), "d w1 (summed over the ranks' tokens)");
        if (!bad.str().empty()) throw std::runtime_error(bad.str());
      });
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) FAIL_CHECK("rank " << r << ": " << errors[r]);
}

TEST_CASE("float8 dispatch over EP 2: the rows travel as e4m3 + a scale each, and equal a high-precision dispatch of "
          "the rows cast at the source, bit for bit",
          "[parallel][moe][float8]") {
  // See Note [Float8 dispatch]: the float8 run sends D + 4 bytes per row and its experts read the
  // arrived cast; the reference sends each row's rowwise cast dequantized (straight through, in
  // float32) and lets the experts cast it again, which gives the same values: every output and
  // gradient must be equal bit for bit.
  const at::Tensor w1 = normal({kExperts, kHidden, kDim}, 1, 0.3), w2 = normal({kExperts, kDim, kHidden}, 2, 0.3);
  const at::Tensor w3 = normal({kExperts, kHidden, kDim}, 3, 0.3);
  const int n = 2;
  const size_t trace_capacity = titan::parallel::comm::comm_trace().capacity();
  titan::parallel::comm::comm_trace().configure(4096, "", 0);
  struct Result {
    at::Tensor out, drows, dw1, dw2, dw3;
  };
  std::vector<Result> results[2];
  for (int mode = 0; mode < 2; ++mode) {
    const bool float8_dispatch = mode == 1;
    results[mode].resize(n);
    const auto errors = titan::testing::run_ranks_on_threads(
        n, std::chrono::seconds(60), [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
          tp::comm::CommOptions options;
          options.timeout = std::chrono::seconds(60);
          tp::comm::Comm ep(store, rank, n, float8_dispatch ? "ep_f8" : "ep_hp", options);
          const int64_t first = tp::expert_parallel::local_experts_begin(kExperts, n, rank), local = kExperts / n;
          auto shard = [&](const at::Tensor& w) { return w.narrow(0, first, local).clone().requires_grad_(true); };
          at::Tensor a = shard(w1), b = shard(w2), c = shard(w3);
          const auto experts_held = swiglu_experts(a, b, c);
          const tmod::moe::SwiGluExperts& experts = *experts_held;
          const std::vector<int64_t> counts = counts_of(rank);
          tmod::moe::ExpertComputes computes = titan::float8::expert_computes({"float8", "rowwise", true});
          computes.float8_dispatch = float8_dispatch;
          at::Tensor rows = normal({total(counts), kDim}, 100 + rank).requires_grad_(true);
          at::Tensor sent = rows;
          if (!float8_dispatch) {  // the rowwise cast at the source, dequantized; straight through
            const titan::float8::Float8Tensor q = titan::float8::to_float8(
                rows.detach(), {titan::float8::ScalingGranularity::Axiswise, at::kFloat8_e4m3fn}, -1, true);
            sent = rows + (titan::float8::dequantize(q) - rows).detach();
          }
          const at::Tensor out = tp::expert_parallel::expert_parallel_experts(sent, counts, experts, ep, {}, computes);
          torch::autograd::backward({out}, {normal(out.sizes().vec(), 200 + rank)});
          results[mode][static_cast<size_t>(rank)] = {out.detach(), rows.grad(), a.grad(), b.grad(), c.grad()};
        });
    for (size_t r = 0; r < errors.size(); ++r)
      if (!errors[r].empty()) FAIL_CHECK("rank " << r << ": " << errors[r]);
  }
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const Result &hp = results[0][static_cast<size_t>(r)], &f8 = results[1][static_cast<size_t>(r)];
    CHECK(at::equal(f8.out, hp.out));
    CHECK(at::equal(f8.drows, hp.drows));
    CHECK(at::equal(f8.dw1, hp.dw1));
    CHECK(at::equal(f8.dw2, hp.dw2));
    CHECK(at::equal(f8.dw3, hp.dw3));
  }
  // The dispatch (each group's 2nd collective: counts, dispatch, combine) moved D + 4 bytes per
  // row in float8 against 4 D in float32.
  int64_t bytes[2] = {0, 0};
  for (const auto& e : titan::parallel::comm::comm_trace().entries())
    if (e.seq == 2 && (e.group == "ep_hp" || e.group == "ep_f8")) bytes[e.group == "ep_f8" ? 1 : 0] += e.bytes;
  REQUIRE(bytes[0] > 0);
  CHECK(bytes[1] * 4 * kDim == bytes[0] * (kDim + 4));
  titan::parallel::comm::comm_trace().configure(trace_capacity, "", 0);
}
