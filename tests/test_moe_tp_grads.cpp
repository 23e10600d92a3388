// Every parameter's gradient of one Qwen3-MoE step (titan's small MoE flavor) under tensor
// parallelism, with and without expert parallelism, against one rank: ranks as threads of this
// process, the gradients gathered to full tensors and compared parameter by parameter. The
// router gate is the parameter this guards (torchtitan issue #4054: with TP and no EP the gate's
// gradient was under-reduced; a layout that forgot to sum its partial gradients over TP, or summed
// a full one, is off by a factor of the TP degree).
//
// Tolerance: the same float32 math in another reduction order (row-parallel partial sums,
// reduce-scatters, vocab-parallel softmax sums); one step's gradients differ by a few ulps of
// their largest element. 1e-5 relative to each tensor's largest element is ~100x that, while a
// factor-of-2 error is 0.5.
#include <catch2/catch.hpp>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/remainder.h>

#include <chrono>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "model/flavors.h"
#include "parallel/parallelize.h"
#include "tests/rank_threads.h"

namespace tp = titan::parallel;

namespace {

constexpr int64_t kRows = 4, kSeq = 16;

// The fixed batch: [kRows, kSeq + 1] tokens.
at::Tensor batch_tokens(int64_t vocab) {
  return at::remainder(at::arange(kRows * (kSeq + 1), at::kLong) * 7919 + 13, vocab).view({kRows, kSeq + 1});
}

// One step's full gradients of every parameter, on the ranks of `dims` (this rank's rows of the
// batch), gathered on every rank; returns rank 0's.
std::map<std::string, at::Tensor> step_gradients(const titan::model::ModelArgs& args, tp::comm::DeviceMesh& mesh) {
  titan::model::Transformer model(args);
  tp::ParallelOptions popt;
  popt.seq_len = kSeq;
  auto pm = tp::parallelize_model(model, mesh, popt);
  pm->init_weights(11);
  auto schedule = tp::build_schedule(model, *pm, mesh, popt);
  const at::Tensor tokens = batch_tokens(args.vocab_size);
  const int dp = mesh.size(tp::comm::MeshDim::kDp), dp_rank = mesh.local_rank(tp::comm::MeshDim::kDp);
  const at::Tensor mine = tokens.narrow(0, dp_rank * (kRows / dp), kRows / dp);
  const double local = schedule->step(mine.narrow(1, 0, kSeq), mine.narrow(1, 1, kSeq), double(kRows * kSeq));
  pm->finish_gradients(local);
  // Each master's gradient through full_param: the gradient put in the master's place.
  std::map<std::string, at::Tensor> grads;
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor>& masters = pm->master_params();
  const std::vector<std::string> names = pm->param_names();
  std::vector<at::Tensor> saved;
  for (const at::Tensor& m : masters) {
    saved.push_back(m.detach().clone());
    if (m.grad().defined()) m.detach().copy_(m.grad());
    else m.detach().zero_();
  }
  // (cloned: without sharding full_param may return the master itself, restored below)
  for (const std::string& name : pm->all_param_names()) grads[name] = pm->full_param(name).clone();
  for (size_t i = 0; i < masters.size(); ++i) masters[i].detach().copy_(saved[i]);
  return grads;
}

}  // namespace

TEST_CASE("Qwen3-MoE gradients parameter by parameter, router gate included: TP 2, EP 2 x TP 2 (ETP 1 and ETP 2) "
          "equal one rank (threads)",
          "[parallel][moe]") {
  titan::model::ModelArgs args = titan::model::model_flavor("qwen3", "debugmodel_moe_small");
  args.vocab_size = 256;
  args.max_seq_len = kSeq;
  std::map<std::string, at::Tensor> want;
  {
    tp::comm::DeviceMesh single(nullptr, tp::comm::resolve_parallel_dims(1, -1, 1, 1, 1, 1));
    want = step_gradients(args, single);
  }
  struct Layout {
    const char* name;
    int dp_shard, tp, ep, etp;
  };
  for (const Layout layout : {Layout{"TP 2", 1, 2, 1, 1}, Layout{"EP 2 x TP 2, ETP 1", 2, 2, 2, 1},
                              Layout{"EP 2 x TP 2, ETP 2", 2, 2, 2, 2}}) {
    const int world = layout.dp_shard * layout.tp;
    std::vector<std::map<std::string, at::Tensor>> got(static_cast<size_t>(world));
    const tp::comm::ParallelDims dims =
        tp::comm::resolve_parallel_dims(1, layout.dp_shard, layout.tp, 1, 1, world, layout.ep, layout.etp);
    const std::chrono::milliseconds timeout(60000);
    const auto errors = titan::testing::run_ranks_on_threads(
        world, timeout, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
          tp::comm::CommOptions opts;
          opts.timeout = timeout;
          tp::comm::DeviceMesh mesh(std::make_unique<tp::comm::Comm>(store, rank, world, "world", opts), dims);
          got[static_cast<size_t>(rank)] = step_gradients(args, mesh);
        });
    for (int rank = 0; rank < world; ++rank) {
      INFO(layout.name << ", rank " << rank << ": " << errors[static_cast<size_t>(rank)]);
      REQUIRE(errors[static_cast<size_t>(rank)].empty());
    }
    REQUIRE(got[0].size() == want.size());
    for (const auto& [name, g] : want) {
      const at::Tensor& mine = got[0].at(name);
      const double scale = g.abs().max().item<double>();
      INFO(layout.name << ": " << name << ", largest |grad| " << scale);
      REQUIRE(scale > 0);
      CHECK((mine - g).abs().max().item<double>() <= 1e-5 * scale);
    }
  }
}

TEST_CASE("Qwen3 with a tied embedding: gradients parameter by parameter at TP 2 equal one rank (threads)",
          "[parallel][moe]") {
  // The tied weight's gradient is the embedding's plus the vocab-parallel output's on each rank's
  // rows; the qk-norm weights' are partial sums over the rank's heads, summed over TP.
  titan::model::ModelArgs args = titan::model::model_flavor("qwen3", "debugmodel");
  args.vocab_size = 256;
  args.max_seq_len = kSeq;
  args.n_layers = 2;
  std::map<std::string, at::Tensor> want;
  {
    tp::comm::DeviceMesh single(nullptr, tp::comm::resolve_parallel_dims(1, -1, 1, 1, 1, 1));
    want = step_gradients(args, single);
  }
  std::vector<std::map<std::string, at::Tensor>> got(2);
  const std::chrono::milliseconds timeout(60000);
  const auto errors = titan::testing::run_ranks_on_threads(2, timeout, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
    tp::comm::CommOptions opts;
    opts.timeout = timeout;
    tp::comm::DeviceMesh mesh(std::make_unique<tp::comm::Comm>(store, rank, 2, "world", opts),
                              tp::comm::resolve_parallel_dims(1, 1, 2, 1, 1, 2));
    got[static_cast<size_t>(rank)] = step_gradients(args, mesh);
  });
  for (const auto& e : errors) REQUIRE(e.empty());
  for (const auto& [name, g] : want) {
    const double scale = g.abs().max().item<double>();
    const double diff = (got[0].at(name) - g).abs().max().item<double>();
    INFO(name << ": largest |grad| " << scale << ", largest difference " << diff);
    CHECK(diff <= 1e-5 * scale);  // measured <= 1.2e-6 (q_norm / k_norm, summed over heads and TP)
  }
}
