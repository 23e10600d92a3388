// Parallel layouts end to end: real titan-train processes (Gloo on 127.0.0.1, one thread each)
// started by titan-run, torchrun, or two titan-run "nodes", checked step by step against the
// single-process run of the same global batch; plus unit tests of the mesh arithmetic and the
// FSDP/TP padding math, and fault handling (a rank failing on purpose, a rank SIGKILLed).
// The tolerances and the harness: tests/layout_check.h.
#include <catch2/catch.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <ATen/core/grad_mode.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <thread>
#include <tuple>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "float8/scaling.h"
#include "model/activation_checkpoint_ops.h"
#include "model/flavors.h"
#include "model/transformer.h"
#include "parallel/fsdp.h"
#include "parallel/parallelize.h"
#include "launcher/launcher.h"
#include "parallel/comm/mesh.h"
#include "parallel/tensor_parallel/tensor_parallel.h"
#include "tests/job_runs.h"
#include "tests/layout_check.h"
#include "tests/rank_threads.h"

#if !defined(TITAN_RUN_PATH) || !defined(TITAN_TRAIN_PATH) || !defined(TITAN_TORCHRUN_PATH)
#error "TITAN_RUN_PATH, TITAN_TRAIN_PATH and TITAN_TORCHRUN_PATH must be defined by the build"
#endif

namespace tp = titan::parallel;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using namespace titan::testing::layout;

namespace {

// Processes whose command line mentions `needle` (leftovers of a job).
std::vector<int> processes_mentioning(const std::string& needle) {
  std::vector<int> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), {});
    if (cmd.find(needle) != std::string::npos && std::stoi(name) != getpid()) pids.push_back(std::stoi(name));
  }
  return pids;
}

// Runs fn(rank, mesh) on `world` threads, the ranks of one Gloo job (tests/rank_threads.h);
// returns each rank's error ("" = ok).
std::vector<std::string> run_ranks_as_threads(int world, const std::function<void(int, tp::comm::DeviceMesh&)>& fn,
                                              const tp::comm::ParallelDims& dims) {
  const std::chrono::milliseconds timeout(30000);
  return titan::testing::run_ranks_on_threads(
      world, timeout, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
        tp::comm::CommOptions opts;
        opts.timeout = timeout;
        tp::comm::DeviceMesh mesh(std::make_unique<tp::comm::Comm>(store, rank, world, "world", opts), dims);
        fn(rank, mesh);
      });
}

}  // namespace

TEST_CASE("parallel dims resolve -1 and reject bad products with the numbers", "[parallel]") {
  auto d = tp::comm::resolve_parallel_dims(1, -1, 2, 1, 1, 8);
  CHECK(d.dp_shard == 4);
  CHECK(d.dp() == 4);
  CHECK(d.non_data_parallel_size() == 2);
  d = tp::comm::resolve_parallel_dims(2, -1, 1, 1, 1, 4);
  CHECK((d.dp_replicate == 2 && d.dp_shard == 2 && d.tp == 1));
  CHECK_THROWS_WITH(tp::comm::resolve_parallel_dims(2, 2, 2, 1, 1, 10),
                    "Invalid parallel dims: dp_replicate(2) * dp_shard(2) * cp(1) * tp(2) * pp(1) != WORLD_SIZE(10)");
  CHECK_THROWS_WITH(tp::comm::resolve_parallel_dims(1, -1, 3, 1, 1, 4),
                    Contains("WORLD_SIZE(4) is not divisible by dp_replicate(1) * cp(1) * tp(3) * pp(1)"));
  d = tp::comm::resolve_parallel_dims(1, -1, 2, 2, 1, 8);  // dp_shard takes what pp x tp leave
  CHECK((d.pp == 2 && d.tp == 2 && d.dp_shard == 2));
  CHECK_THROWS_WITH(tp::comm::resolve_parallel_dims(1, 1, 1, 3, 1, 4),
                    "Invalid parallel dims: dp_replicate(1) * dp_shard(1) * cp(1) * tp(1) * pp(3) != WORLD_SIZE(4)");
  const tp::comm::ParallelDims cp2 = tp::comm::resolve_parallel_dims(1, -1, 1, 1, 2, 4);  // dp_shard takes the rest
  CHECK((cp2.cp == 2 && cp2.dp_shard == 2 && cp2.dp_shard_cp() == 4 && cp2.dp_cp() == 4 && cp2.dp() == 2));
}

TEST_CASE("mesh coordinates and groups: tp innermost, then dp_shard, then dp_replicate", "[parallel]") {
  const auto d = tp::comm::resolve_parallel_dims(2, 2, 2, 1, 1, 8);
  for (int r = 0; r < 8; ++r) CHECK(tp::comm::mesh_rank(d, tp::comm::mesh_coord(d, r)) == r);
  const auto c = tp::comm::mesh_coord(d, 6);  // 6 = (1 * 2 + 1) * 2 + 0
  CHECK((c.dp_replicate == 1 && c.dp_shard == 1 && c.tp == 0));
  using G = std::vector<std::vector<int>>;
  CHECK(tp::comm::mesh_groups(d, tp::comm::MeshDim::kTp) == G{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(tp::comm::mesh_groups(d, tp::comm::MeshDim::kDpShard) == G{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(tp::comm::mesh_groups(d, tp::comm::MeshDim::kDpReplicate) == G{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(tp::comm::mesh_groups(d, tp::comm::MeshDim::kDp) == G{{0, 2, 4, 6}, {1, 3, 5, 7}});
}

TEST_CASE("dim-0 shards are padded, never a crash", "[parallel]") {
  // vocab 258 over 4 ranks: 65 rows each, the last rank holds 63 real rows + 2 padding rows.
  auto l = tp::shard_layout(258, 3, 4);
  CHECK((l.padded_rows == 260 && l.shard_rows == 65 && l.valid_rows == 63));
  CHECK(tp::shard_layout(258, 0, 4).valid_rows == 65);
  CHECK(tp::shard_layout(256, 2, 3).padded_rows == 258);
  CHECK(tp::shard_layout(256, 2, 3).valid_rows == 84);
  CHECK(tp::shard_layout(2, 3, 4).valid_rows == 0);  // fewer rows than ranks: an all-padding shard
  CHECK(tp::tensor_parallel::padded_size(258, 4) == 260);
  CHECK(tp::tensor_parallel::valid_in_chunk(258, 3, 4) == 63);
  at::Tensor full = at::arange(10, at::kFloat).view({5, 2});
  at::Tensor last = tp::tensor_parallel::padded_chunk(full, 0, 2, 3);  // rows [4, 6) of a 6-row padded tensor
  CHECK(last.sizes() == at::IntArrayRef({2, 2}));
  CHECK(last[0][1].item<float>() == 9.0f);
  CHECK(last[1][0].item<float>() == 0.0f);
  CHECK(at::equal(tp::tensor_parallel::padded_chunk(full, 1, 1, 2), full.narrow(1, 1, 1)));
}

TEST_CASE("sharded init equals the single-process weights bit for bit (FSDP 2, FSDP 3, TP 2, FSDP 2 x TP 2, HSDP, threads)", "[parallel]") {
  // Ranks as threads of this process (as tests/test_comm.cpp), each with its own store client.
  // Each rank generates only its own elements (Note [Counter-based init] in
  // model/init_philox.h); gathered, they must be the single process's weights exactly.
  titan::model::ModelArgs args = titan::model::model_flavor("llama3", "debugmodel");
  args.vocab_size = 258;  // divisible by neither 3 nor 4: padded in TP and FSDP
  args.max_seq_len = 32;
  titan::model::Transformer single(args);
  single.materialize(c10::kCPU, at::kFloat);
  single.init_weights(7);
  std::map<std::string, at::Tensor> expected;
  int64_t total = 0;
  single.visit_params([&](const std::string& fqn, at::Tensor& p) {
    expected[fqn] = p;
    total += p.numel();
  });
  struct Layout { int replicate, shard, tp; };
  for (const Layout layout : {Layout{1, 2, 1}, Layout{1, 3, 1}, Layout{1, 1, 2}, Layout{1, 2, 2},
                              Layout{2, 2, 1}}) {
    const int world = layout.replicate * layout.shard * layout.tp;
    std::vector<int64_t> local_numel(world, 0);
    const auto errors = run_ranks_as_threads(world, [&](int rank, tp::comm::DeviceMesh& mesh) {
      titan::model::Transformer model(args);
      tp::ParallelOptions popt;
      popt.seq_len = 32;
      auto pm = tp::parallelize_model(model, mesh, popt);
      pm->init_weights(7);
      for (const auto& m : pm->master_params()) local_numel[rank] += m.numel();
      for (const auto& name : pm->param_names()) {
        const at::Tensor full = pm->full_param(name);
        if (!at::equal(full, expected.at(name))) throw std::runtime_error(name + " differs");
      }
    }, tp::comm::resolve_parallel_dims(layout.replicate, layout.shard, layout.tp, 1, 1, world));
    const int model_shards = layout.shard * layout.tp;
    for (int rank = 0; rank < world; ++rank) {
      INFO("layout " << layout.replicate << "x" << layout.shard << "x" << layout.tp << ", rank "
                     << rank << ": " << errors[rank]);
      CHECK(errors[rank].empty());
      // ~1/(shard x tp) of the model per rank (plus padding rows and the replicated norms).
      CHECK(local_numel[rank] < total / model_shards + total / 100);
    }
  }
}

TEST_CASE("FSDP float8 all-gather: global-amax scale, gathered bytes, precomputed scales (threads)",
          "[parallel][float8]") {
  // Note [FSDP float8 all-gather]. A [5, 16] weight over 2 ranks (3 rows each, one padding row)
  // next to a high-precision norm weight in the same group. Row 4 (rank 1's shard) holds the
  // global amax, so rank 0 only gets the right scale through the MAX all-reduce.
  at::Tensor full = at::arange(80, at::kFloat).view({5, 16}).sub(40).div(7);
  full[4][3] = 1000.0f;
  const at::Tensor norm = at::arange(16, at::kFloat);
  const auto e4m3 = at::ScalarType::Float8_e4m3fn;
  auto expected_scale = [&](const at::Tensor& w) {
    return titan::float8::scale_from_amax(titan::float8::amax(w, titan::float8::ScalingGranularity::Tensorwise, 0),
                                          e4m3, false);
  };
  auto as_bytes = [](const at::Tensor& f8) { return f8.contiguous().view(at::kByte); };
  const auto errors = run_ranks_as_threads(2, [&](int, tp::comm::DeviceMesh& mesh) {
    tp::Fsdp fsdp(*mesh.comm(tp::comm::MeshDim::kDpShard), at::kFloat, c10::kCPU);
    at::Tensor w_slot, norm_slot;
    titan::model::QuantizedOperand w_cast;  // the linear's weight_cast slot
    tp::FsdpFloat8Weight f8{e4m3, false, &w_cast};
    fsdp.add_group("block", {{"w", &w_slot, {5, 16}, f8}, {"norm", &norm_slot, {16}}}, true);
    fsdp.load_full("w", full);
    fsdp.load_full("norm", norm);
    fsdp.attach_params();
    auto gather_once = [&] {  // a forward without grad: unshard, run, reshard
      at::Tensor seen_data, seen_scale;
      fsdp.run_group(0, at::zeros({1}), [&](const at::Tensor& x) {
        if (!at::equal(norm_slot, norm)) throw std::runtime_error("norm not gathered in float32");
        if (w_cast.defined()) {
          seen_data = w_cast.data.clone();
          seen_scale = w_cast.scale.clone();
        }
        return x;
      });
      if (w_cast.defined()) throw std::runtime_error("reshard did not clear the float8 weight");
      if (!seen_data.defined() || seen_data.scalar_type() != e4m3 || seen_data.sizes() != full.sizes())
        throw std::runtime_error("no [5, 16] e4m3 weight was published");
      return std::make_pair(seen_data, seen_scale);
    };
    // Dynamic: the scale of the full weight's amax; the bytes of casting the full weight.
    auto [data, scale] = gather_once();
    if (!at::equal(scale, expected_scale(full))) throw std::runtime_error("scale is not the global amax's");
    if (!at::equal(as_bytes(data), as_bytes(titan::float8::cast_to_float8(full, scale, e4m3))))
      throw std::runtime_error("gathered bytes differ from casting the full weight");
    // Precomputed: taken after "the optimizer step"; a later change of the shards (here x2)
    // is cast with it, proving the unshard used it instead of measuring the amax again.
    fsdp.precompute_float8_scales();
    {
      at::NoGradGuard no_grad;
      fsdp.masters()[0].mul_(2);
    }
    std::tie(data, scale) = gather_once();
    if (!at::equal(scale, expected_scale(full))) throw std::runtime_error("precomputed scale not used");
    if (!at::equal(as_bytes(data), as_bytes(titan::float8::cast_to_float8(full * 2, scale, e4m3))))
      throw std::runtime_error("bytes with the precomputed scale differ");
    // Loading weights invalidates the precomputed scales.
    fsdp.load_full("w", full * 2);
    std::tie(data, scale) = gather_once();
    if (!at::equal(scale, expected_scale(full * 2))) throw std::runtime_error("stale scale after load_full");
  }, tp::comm::resolve_parallel_dims(1, 2, 1, 1, 1, 2));
  for (size_t rank = 0; rank < errors.size(); ++rank) {
    INFO("rank " << rank << ": " << errors[rank]);
    CHECK(errors[rank].empty());
  }
}

TEST_CASE("per-op AC under TP keeps the reduce-scatter outputs (threads)", "[parallel][ac]") {
  // Row-parallel wo and w2 end in a sequence reduce-scatter that goes through the op layer
  // (model/activation_checkpoint_ops.h): under per-op AC its output is kept, so the recompute in backward
  // replays it instead of communicating. Here: one TP-2 block's recorded forward.
  titan::model::ModelArgs args = titan::model::model_flavor("llama3", "debugmodel");
  args.max_seq_len = 16;
  const auto errors = run_ranks_as_threads(2, [&](int, tp::comm::DeviceMesh& mesh) {
    titan::model::Transformer model(args);
    tp::ParallelOptions popt;
    popt.seq_len = 16;
    auto pm = tp::parallelize_model(model, mesh, popt);
    pm->init_weights(5);
    auto rope = titan::model::make_rotary_table(args.dim / args.n_heads, 16, args.rope_theta, c10::kCPU);
    at::NoGradGuard no_grad;
    titan::model::OpCheckpointStore store(tp::selective_ac_save_list());
    {
      titan::model::OpCheckpointScope record(&store, titan::model::OpCheckpointPhase::kRecord);
      model.blocks()[0]->forward(at::randn({2, 8, args.dim}), rope);  // [B, S/tp, D] sequence shard
    }
    int64_t kept_reduce_scatters = 0;
    for (const auto& e : store.entries()) kept_reduce_scatters += e.op == "reduce_scatter" && e.kept;
    if (kept_reduce_scatters != 2)
      throw std::runtime_error("kept " + std::to_string(kept_reduce_scatters) + " reduce-scatters, want 2 (wo, w2)");
  }, tp::comm::resolve_parallel_dims(1, 1, 2, 1, 1, 2));
  for (size_t rank = 0; rank < errors.size(); ++rank) {
    INFO("rank " << rank << ": " << errors[rank]);
    CHECK(errors[rank].empty());
  }
}

TEST_CASE("FSDP and HSDP layouts reproduce the single-process losses", "[parallel][dist]") {
  check_layout("fsdp2", 2, "--parallelism.data_parallel_shard_degree 2");
  check_layout("fsdp2_always", 2, "--parallelism.fsdp_reshard_after_forward always");
  check_layout("fsdp2_never", 2, "--parallelism.fsdp_reshard_after_forward never");
  // 4 ranks: vocab 258 is not divisible by 4, so the embedding and output shards are padded.
  check_layout("fsdp4", 4, "");
  check_layout("hsdp2x2", 4, "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2");
}

TEST_CASE("FSDP over 3 ranks pads dims not divisible by 3", "[parallel][dist]") {
  // dim 256 (norms, every linear's dim 0 or 1) is not divisible by 3; global batch 6.
  check_layout("fsdp3", 3, "", /*global_batch=*/6);
}

TEST_CASE("tensor + sequence parallel layouts reproduce the single-process losses", "[parallel][dist]") {
  check_layout("tp2", 2, "--parallelism.tensor_parallel_degree 2");
  check_layout("tp2_no_loss_parallel", 2, "--parallelism.tensor_parallel_degree 2 --parallelism.disable_loss_parallel");
  // TP 4: vocab 258 padded to 260 over 4 ranks; the loss ignores the padding columns.
  check_layout("tp4", 4, "--parallelism.tensor_parallel_degree 4");
  check_layout("fsdp2_tp2", 4, "--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2");
}

TEST_CASE("float8 under FSDP and TP reproduces the single-process float8 losses", "[parallel][dist][float8]") {
  // FSDP gathers the float32 master weights and each Float8LinearCompute casts the full weight
  // (the tensorwise scale is the global amax, exactly as in one process); TP wraps the float8
  // computes of the sharded linears. Step 1 sees identical weights, so its loss must match to
  // the float32 tolerance. Later steps inherit float32 reduction-order differences (gradient
  // reduce-scatter / TP all-reduce) that can flip an element's e4m3 rounding (one e4m3 step is
  // 2^-3 relative), so they get a looser bound: measured (CPU, emulated) at most 7.1e-5 loss and
  // 4.1e-4 grad norm relative over 10 steps; the bounds leave ~7x / ~5x margin.
  Tolerance f8;
  f8.loss = 5e-4;
  f8.grad_norm = 2e-3;
  // (FSDP 2 tensorwise: the next test case, with and without the float8 all-gather.)
  check_layout("fsdp2_float8_rowwise", 2, "--parallelism.data_parallel_shard_degree 2", 8,
               "--float8.enable_float8_linear --float8.recipe_name rowwise", f8);
  check_layout("tp2_float8_rowwise", 2, "--parallelism.tensor_parallel_degree 2", 8,
               "--float8.enable_float8_linear --float8.recipe_name rowwise", f8);
  // Seed 004's crash: float8 rowwise + TP + full activation checkpointing, where the recompute
  // re-cast a 3-D activation whose rowwise scale had been flattened. Scales keep the data's rank
  // (Note [Scale follows data]), so this layout trains like the single-process float8 run.
  check_layout("tp2_float8_rowwise_full_ac", 2, "--parallelism.tensor_parallel_degree 2", 8,
               "--float8.enable_float8_linear --float8.recipe_name rowwise "
               "--activation_checkpoint.mode full", f8);
}

TEST_CASE("block-scaled recipes under FSDP, TP, async TP and AC reproduce the single-process runs",
          "[parallel][dist][float8]") {
  // FSDP gathers the float32 master weights, so every block is cast from the whole weight, as in
  // one process; TP splits each sharded dimension into whole blocks per rank (checked at
  // start-up: parallel::check_block_scaled_tp), so every rank casts the blocks one process casts.
  // What differs is float32 reduction order (gradient reduce-scatters, TP partial sums), which
  // may move an element across an e4m3 rounding boundary after step 1: the float8 tolerance of
  // the test above applies (one e4m3 step is 2^-3 relative, the same element format).
  Tolerance f8;
  f8.loss = 5e-4;
  f8.grad_norm = 2e-3;
  check_layout("fsdp2_mxfp8", 2, "--parallelism.data_parallel_shard_degree 2", 8,
               "--model.converters mx --mx.recipe_name mxfp8_cublas", f8);
  check_layout("tp2_async_mxfp8_rceil_op_ac", 2,
               "--parallelism.tensor_parallel_degree 2 --parallelism.enable_async_tensor_parallel "
               "--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op", 8,
               "--model.converters mx --mx.recipe_name mxfp8_cublas_rceil", f8);
  check_layout("tp2_blockwise_full_ac", 2,
               "--parallelism.tensor_parallel_degree 2 --activation_checkpoint.mode full", 8,
               "--float8.enable_float8_linear --float8.recipe_name blockwise", f8);
}

TEST_CASE("a block straddling two TP shards is a config error naming the linear", "[parallel][dist][float8]") {
  // The debug model's wq has 256 output features: TP 4 leaves 64 per rank, half a 128 x 128 tile.
  const fs::path dump = root() / "tp4_blockwise_refused";
  const Run r = run_job(std::string(TITAN_RUN_PATH) + " --nproc-per-node 4 -- " + TITAN_TRAIN_PATH + " " +
                            train_args(dump, 8) + " --parallelism.tensor_parallel_degree 4 "
                            "--float8.enable_float8_linear --float8.recipe_name blockwise",
                        dump.string() + ".log");
  INFO(r.log);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.log, Contains("layers.0.attention.wq") && Contains("would straddle two ranks"));
}

TEST_CASE("bfloat16 compute under FSDP, TP and PP reproduces the single-process bfloat16 run", "[parallel][dist][bf16]") {
  // float32 masters and optimizer state, bf16 compute copies (FSDP casts while it gathers),
  // gradient reduction in float32 (training.mixed_precision_reduce). FSDP and PP change only
  // float32 reduction order at step 1 (measured 0 and 1e-8 relative); TP sums row-parallel
  // partial products that were each rounded to bf16 (8 significant bits), where one process
  // rounds the whole sum once: 2^-9 relative per activation element, averaging to 1.4e-5 on the
  // step-1 loss. After that, any bf16 rounding that flips with a float32-order difference moves
  // an activation by 2^-9, and AdamW's normalized update carries it into the weights: measured
  // over 10 steps (CPU), loss 7.4e-5 / 9.7e-5 / 1.2e-4 and grad norm 4.9e-4 / 4.7e-4 / 5.3e-4
  // relative (FSDP / TP / PP). Bounds ~7x over: 1e-4 at step 1, 1e-3 after, 3e-3 for grad norms.
  Tolerance bf16;
  bf16.first_loss = 1e-4;
  bf16.loss = 1e-3;
  bf16.grad_norm = 3e-3;
  const std::string shared = "--training.mixed_precision_param bfloat16";
  check_layout("fsdp2_bf16", 2, "--parallelism.data_parallel_shard_degree 2", 8, shared, bf16);
  check_layout("tp2_bf16", 2, "--parallelism.tensor_parallel_degree 2", 8, shared, bf16);
  check_layout("pp2_bf16", 2, "--parallelism.pipeline_parallel_degree 2", 8, shared, bf16);
}

TEST_CASE("validation under FSDP, TP, FSDP x TP, PP and CP equals one process", "[parallel][dist][validation]") {
  // See Note [Validation] in trainer/validate.h. The validation batch is held at 4 sequences in
  // every layout (local_batch_size 4 / data-parallel degree), so every run evaluates the same
  // tokens; after 4 training steps the weights differ by float32 reduction order only, and the
  // validation loss (a sum of token losses over every data-parallel rank) gets the layouts'
  // reduction-order tolerance (tests/layout_check.h: 1e-5 relative, ~10x what such reorderings
  // give).
  const fs::path corpus = root() / "validation.jsonl";
  {
    std::ofstream out(corpus);
    for (int i = 0; i < 40; ++i)
      out << "{\"text\": \"validation document " << i << " with some words " << i * 7 << " in it\"}\n";
  }
  auto validation_args = [&](int local_batch) {
    return " --validation.enable --validation.dataset jsonl --validation.dataset_path " + corpus.string() +
           " --validation.local_batch_size " + std::to_string(local_batch) + " --validation.seq_len 32 " +
           "--validation.freq 2 --training.steps 4";
  };
  auto validation_losses = [](const fs::path& metrics) {
    std::vector<double> out;
    for (const auto& j : titan::testing::read_metrics_lines(metrics))
      if (j.contains("validation_metrics/loss")) out.push_back(j["validation_metrics/loss"].get<double>());
    return out;
  };
  const fs::path single = root() / "validation_single";
  const Run ref = run_job(std::string(TITAN_TRAIN_PATH) + " " + train_args(single, 8) + validation_args(4),
                          single.string() + ".log");
  INFO(ref.log);
  REQUIRE(ref.exit_code == 0);
  const std::vector<double> want = validation_losses(single / "metrics.jsonl");
  REQUIRE(want.size() == 2);  // after steps 2 and 4
  const std::vector<std::tuple<std::string, int, std::string, int>> layouts = {
      {"fsdp2", 2, "--parallelism.data_parallel_shard_degree 2", 2},
      {"tp2", 2, "--parallelism.tensor_parallel_degree 2", 4},
      {"fsdp2_tp2", 4, "--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2", 2},
      {"pp2", 2, "--parallelism.pipeline_parallel_degree 2", 4},
      {"cp2", 2, "--parallelism.context_parallel_degree 2", 4},
  };
  for (const auto& [name, nproc, layout, local_batch] : layouts) {
    const fs::path dump = root() / ("validation_" + name);
    const Run r = run_job(std::string(TITAN_RUN_PATH) + " --nproc-per-node " + std::to_string(nproc) + " -- " +
                              TITAN_TRAIN_PATH + " " + train_args(dump, 8) + " " + layout + validation_args(local_batch),
                          dump.string() + ".log");
    INFO(name << ":\n" << r.log);
    REQUIRE(r.exit_code == 0);
    for (int rank = 0; rank < nproc; ++rank) {
      const std::vector<double> got = validation_losses(dump / ("metrics_rank" + std::to_string(rank) + ".jsonl"));
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        INFO(name << " rank " << rank << " validation " << i);
        CHECK(got[i] == Approx(want[i]).epsilon(kLossRelTol));
      }
    }
  }
}

TEST_CASE("FSDP float8 all-gather (and precomputed scales) reproduces the float8 runs", "[parallel][dist][float8]") {
  // See Note [FSDP float8 all-gather] in parallel/fsdp.h: each float32 master shard is cast to
  // e4m3 with the scale of the global amax (one MAX all-reduce, or the precomputed one from after
  // the optimizer step, which is the same number because the weights have not changed since), and
  // the bytes are gathered. With float32 compute that is the same cast, element by element, as
  // casting the gathered float32 weight, so these runs must equal the high-precision-gather FSDP
  // run bit for bit, and the 1-process float8 run within the float8 tolerance of the test above.
  Tolerance f8;
  f8.loss = 5e-4;
  f8.grad_norm = 2e-3;
  const std::string shared = "--float8.enable_float8_linear --float8.recipe_name tensorwise";
  const std::string fsdp = "--parallelism.data_parallel_shard_degree 2";
  check_layout("fsdp2_float8_hp_gather", 2, fsdp, 8, shared, f8);
  const std::vector<std::pair<std::string, std::string>> variants = {
      {"fsdp2_float8_all_gather", " --float8.enable_fsdp_float8_all_gather"},
      {"fsdp2_float8_all_gather_precompute",
       " --float8.enable_fsdp_float8_all_gather --float8.precompute_float8_dynamic_scale_for_fsdp"},
      // Full AC re-runs each block inside backward: FSDP re-gathers the float8 weights there.
      {"fsdp2_float8_all_gather_precompute_full_ac",
       " --float8.enable_fsdp_float8_all_gather --float8.precompute_float8_dynamic_scale_for_fsdp"
       " --activation_checkpoint.mode full --parallelism.fsdp_reshard_after_forward always"},
      // Per-op AC: FSDP's gather (and its amax all-reduce) runs outside the checkpointed block
      // (Note [FSDP wraps AC]). When AC wrapped FSDP, the first forward recorded FSDP's amax
      // and the recompute, finding the group already gathered, failed ("op #3 was 'amax' in the
      // first forward but 'mm' in the recompute").
      {"fsdp2_float8_all_gather_op_ac",
       " --float8.enable_fsdp_float8_all_gather --activation_checkpoint.mode selective"
       " --activation_checkpoint.selective_ac_option op"},
  };
  const auto hp_gather = read_metrics(root() / "fsdp2_float8_hp_gather" / "metrics_rank0.jsonl");
  for (const auto& [name, args] : variants) {
    check_layout(name, 2, fsdp + args, 8, shared, f8);
    check_same_steps(name + " vs the high-precision-gather FSDP run",
                     read_metrics(root() / name / "metrics_rank0.jsonl"), hp_gather);
  }
  // The log says what was gathered in float8, and the gathered buffers are smaller.
  std::ifstream log((root() / "fsdp2_float8_all_gather.log").string());
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  CHECK(text.find("42 float8 linear weights gathered in float8") != std::string::npos);
}

TEST_CASE("TP float8 input all-gather reproduces the high-precision-gather TP run", "[parallel][dist][float8]") {
  // Note [Float8 operands from the producer]: attention / feed_forward inputs are cast with the
  // scale of their global amax (one MAX all-reduce) and gathered as e4m3 bytes; casting the
  // gathered float32 input gives the same bytes, so with float32 compute the run must equal the
  // high-precision-gather TP run bit for bit. Full AC re-gathers inside the recompute.
  const std::string args = "--float8.enable_float8_linear --float8.recipe_name tensorwise "
                           "--parallelism.tensor_parallel_degree 2";
  auto run = [&](const std::string& name, const std::string& extra, int nproc = 2) {
    const fs::path dump = root() / name;
    const Run r = run_job(std::string(TITAN_RUN_PATH) + " --nproc-per-node " + std::to_string(nproc) +
                            " -- " + TITAN_TRAIN_PATH + " " + train_args(dump) + " " + args + extra,
                        dump.string() + ".log");
    INFO(name << ":\n" << r.log);
    REQUIRE(r.exit_code == 0);
    CHECK((r.log.find("module inputs all-gathered in float8") != std::string::npos) ==
          (extra.find("tp_input_all_gather=false") == std::string::npos));
    return read_metrics(dump / "metrics_rank0.jsonl");
  };
  const auto hp_gather = run("tp2_float8_tensorwise_hp_gather", " --float8.tp_input_all_gather=false");
  // Against one float8 process: TP-sharded operands take the TP group's amax (Note [Scales under
  // TP] in float8/float8_linear.h), so step 1 casts exactly as one process does; later steps
  // inherit float32 reduction-order differences that flip single e4m3 roundings (as for FSDP;
  // measured 4.0e-5 loss and 5.4e-4 grad norm relative over 10 steps; same bounds as the other
  // float8 layouts).
  const auto& ref = reference(8, "--float8.enable_float8_linear --float8.recipe_name tensorwise");
  REQUIRE(hp_gather.size() == ref.size());
  for (size_t s = 0; s < ref.size(); ++s) {
    INFO("TP 2 tensorwise vs one float8 process, step " << s + 1);
    CHECK(hp_gather[s].loss == Approx(ref[s].loss).epsilon(s == 0 ? kLossRelTol : 5e-4));
    CHECK(hp_gather[s].grad_norm == Approx(ref[s].grad_norm).epsilon(2e-3));
  }
  for (const auto& [name, extra] : std::vector<std::pair<std::string, std::string>>{
           {"tp2_float8_input_all_gather", ""},
           {"tp2_float8_input_all_gather_full_ac", " --activation_checkpoint.mode full"}}) {
    check_same_steps(name + " vs the high-precision-gather TP run", run(name, extra), hp_gather);
  }
  std::ifstream log((root() / "tp2_float8_input_all_gather.log").string());
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  CHECK(text.find("12 module inputs all-gathered in float8") != std::string::npos);  // 6 blocks x 2
  // FSDP 2 x TP 2 with every float8 gather (inputs over TP, weights over FSDP with precomputed
  // scales) against the same layout gathering everything in high precision.
  const std::string fsdp = " --parallelism.data_parallel_shard_degree 2";
  check_same_steps("fsdp2_tp2 with float8 input and weight all-gathers",
                   run("fsdp2_tp2_float8_all_gathers", fsdp + " --float8.enable_fsdp_float8_all_gather"
                                                           " --float8.precompute_float8_dynamic_scale_for_fsdp", 4),
                   run("fsdp2_tp2_float8_hp_gathers", fsdp + " --float8.tp_input_all_gather=false", 4));
}

TEST_CASE("tensor parallel degree must divide the heads", "[parallel][dist]") {
  const fs::path dump = root() / "tp3";
  const Run r = run_job(std::string(TITAN_RUN_PATH) + " --nproc-per-node 3 -- " + TITAN_TRAIN_PATH +
                          " " + train_args(dump) + " --parallelism.tensor_parallel_degree 3",
                      dump.string() + ".log");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.log, Contains("tensor parallel degree 3 does not divide the number of attention heads n_heads (16)"));
}

TEST_CASE("bad degrees are a config error with the numbers", "[parallel]") {
  const fs::path dump = root() / "bad_dims";
  const Run r = run_job(std::string(TITAN_TRAIN_PATH) + " " + train_args(dump) +
                          " --parallelism.data_parallel_shard_degree 1 --parallelism.tensor_parallel_degree 2",
                      dump.string() + ".log");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.log, Contains("Invalid parallel dims: dp_replicate(1) * dp_shard(1) * cp(1) * tp(2) * pp(1) != WORLD_SIZE(1)"));
}

TEST_CASE("the trainer runs under the real torchrun", "[parallel][dist]") {
  const auto& ref = reference();
  const fs::path dump = root() / "torchrun";
  const int port = titan::launcher::pick_free_port();
  const Run r = run_job(std::string(TITAN_TORCHRUN_PATH) + " --nproc-per-node 2 --master-port " +
                          std::to_string(port) + " --no-python " + TITAN_TRAIN_PATH + " " +
                          train_args(dump),
                      dump.string() + ".log");
  INFO(r.log);
  REQUIRE(r.exit_code == 0);
  const auto got = read_metrics(dump / "metrics_rank1.jsonl");
  REQUIRE(got.size() == ref.size());
  for (size_t s = 0; s < ref.size(); ++s) CHECK(got[s].loss == Approx(ref[s].loss).epsilon(kLossRelTol));
}

TEST_CASE("Holistic Trace Analysis reads a 2-rank profile as two ranks", "[parallel][dist]") {
  // FSDP 2, the profiler on for steps 3-4 (warmup 1, active 2, every 4 steps): each rank writes
  // its trace; HTA (scripts/hta_check.py, installed by scripts/setup.sh into .deps/hta) must
  // find ranks 0 and 1 with their distributedInfo and a ProfilerStep#N iteration each.
  const fs::path dump = root() / "hta";
  const Run r = run_job(std::string(TITAN_RUN_PATH) + " --nproc-per-node 2 " + TITAN_TRAIN_PATH +
                            " " + train_args(dump, 8, 4) +
                            " --parallelism.data_parallel_shard_degree 2"
                            " --profiling.enable_profiling true --profiling.profile_freq 4"
                            " --profiling.profiler_warmup 1 --profiling.profiler_active 2",
                        dump.string() + ".log");
  INFO(r.log);
  REQUIRE(r.exit_code == 0);
  const fs::path traces = dump / "profile_traces" / "iteration_4";
  REQUIRE(fs::exists(traces / "rank0_trace.json"));
  REQUIRE(fs::exists(traces / "rank1_trace.json"));
  const std::string source = std::getenv("TITAN_SOURCE_DIR");
  const Run hta = run_job("PYTHONPATH=" + source + "/.deps/hta " + TITAN_PYTHON + " " + source +
                              "/scripts/hta_check.py " + traces.string() + " 2",
                          dump.string() + ".hta.log");
  INFO(hta.log);
  CHECK(hta.exit_code == 0);
  CHECK_THAT(hta.log, Contains("hta: rank 0:") && Contains("hta: rank 1:") &&
                          Contains("'world_size': 2"));
}

TEST_CASE("two titan-run processes act as two nodes", "[parallel][dist]") {
  const auto& ref = reference();
  const fs::path dump = root() / "two_nodes";
  const std::string launcher = std::string(TITAN_RUN_PATH) +
                               " --nnodes 2 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port " +
                               std::to_string(titan::launcher::pick_free_port());
  const std::string train = std::string(" -- ") + TITAN_TRAIN_PATH + " " + train_args(dump);
  const std::string both = "bash -c '" + launcher + " --node-rank 1" + train + " > " + dump.string() +
                           ".node1.log 2>&1 & n1=$!; " + launcher + " --node-rank 0" + train +
                           "; r0=$?; wait $n1; r1=$?; exit $((r0 | r1))'";
  const Run r = run_job(both, dump.string() + ".node0.log");
  INFO(r.log);
  REQUIRE(r.exit_code == 0);
  for (int rank = 0; rank < 2; ++rank) {
    const auto got = read_metrics(dump / ("metrics_rank" + std::to_string(rank) + ".jsonl"));
    REQUIRE(got.size() == ref.size());
    for (size_t s = 0; s < ref.size(); ++s) CHECK(got[s].loss == Approx(ref[s].loss).epsilon(kLossRelTol));
  }
}

TEST_CASE("a failing rank stops the whole job within seconds, leaving no process", "[parallel][dist]") {
  SECTION("fault injection: rank 1 throws at step 3") {
    const fs::path dump = root() / "fail_on_purpose";
    const Run r = run_job(std::string(TITAN_RUN_PATH) + " --nproc-per-node 2 -- " + TITAN_TRAIN_PATH +
                            " " + train_args(dump, 8, 1000) +
                            " --comm.debug_fail_at_step 3 --comm.debug_fail_rank 1",
                        dump.string() + ".log");
    INFO(r.log);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.log, Contains("rank 1 fails on purpose at step 3"));
    CHECK_THAT(r.log, Contains("titan-run: FAILED: rank 1"));
    CHECK(r.seconds < 60);  // 1000 steps would take minutes
    CHECK(processes_mentioning(dump.string()).empty());
  }
  SECTION("SIGKILL of one rank") {
    const fs::path dump = root() / "sigkill";
    // Kill rank 1 once it has logged a step; titan-run must name it and stop rank 0.
    const fs::path script = dump.string() + ".sh";
    {
      std::ofstream out(script);
      out << "(for i in $(seq 1 600); do [ -s " << (dump / "metrics_rank1.jsonl").string()
          << " ] && break; sleep 0.1; done\n"
          << " for p in $(pgrep -f 'titan-train.*" << dump.string() << "'); do\n"
          << "  tr '\\0' '\\n' < /proc/$p/environ | grep -qx RANK=1 && kill -9 $p\n"
          << " done) &\n"
          << TITAN_RUN_PATH << " --nproc-per-node 2 -- " << TITAN_TRAIN_PATH << " "
          << train_args(dump, 8, 1000) << "\nrc=$?\nwait\nexit $rc\n";
    }
    const Run r = run_job("bash " + script.string(), dump.string() + ".log");
    INFO(r.log);
    CHECK(r.exit_code == 128 + 9);
    CHECK_THAT(r.log, Contains("rank 1 (local 1"));
    CHECK_THAT(r.log, Contains("SIGKILL"));
    CHECK(r.seconds < 60);
    CHECK(processes_mentioning(dump.string()).empty());
  }
}

TEST_CASE("activation checkpointing under FSDP and TP: the very same losses as without AC", "[parallel][dist][ac]") {
  // AC recomputes each block in backward (re-gathering FSDP parameters, repeating TP
  // collectives); the float32 math is the same, so every step must match the layout without AC
  // exactly, not just within the cross-layout tolerance.
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"fsdp2", "--parallelism.data_parallel_shard_degree 2"},
      {"tp2", "--parallelism.tensor_parallel_degree 2"},
  };
  const std::vector<std::pair<std::string, std::string>> modes = {
      {"full", "--activation_checkpoint.mode full"},
      {"op", "--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op"},
  };
  for (const auto& [layout, layout_args] : layouts) {
    auto run_layout = [&, layout = layout, layout_args = layout_args](const std::string& tag,
                                                                      const std::string& extra) {
      const fs::path dump = root() / ("ac_" + layout + "_" + tag);
      const Run r = run_job(std::string(TITAN_RUN_PATH) + " --nproc-per-node 2 -- " + TITAN_TRAIN_PATH +
                              " " + train_args(dump, 8, 4) + " " + layout_args + " " + extra,
                          dump.string() + ".log");
      INFO(layout << " " << tag << ":\n" << r.log);
      REQUIRE(r.exit_code == 0);
      return read_metrics(dump / "metrics.jsonl");
    };
    const auto plain = run_layout("none", "");
    for (const auto& [mode, mode_args] : modes) {
      check_same_steps(layout + " AC " + mode, run_layout(mode, mode_args), plain);
    }
  }
}

TEST_CASE("block-causal attention under FSDP, TP, FSDP x TP and per-op AC reproduces the single-process run",
          "[parallel][dist]") {
  // Documents come from each rank's full token rows (model/document_attention.h); TP's attention
  // runs on its heads over the gathered sequence, so every layout sees the same documents.
  const std::string block = "--model.attn_mask_type block_causal";
  check_layout("block_causal_fsdp2", 2, "--parallelism.data_parallel_shard_degree 2", 8, block);
  check_layout("block_causal_tp2", 2, "--parallelism.tensor_parallel_degree 2", 8, block);
  check_layout("block_causal_fsdp2_tp2", 4,
               "--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2", 8, block);
  check_layout("block_causal_fsdp2_ac_op", 2,
               "--parallelism.data_parallel_shard_degree 2 --activation_checkpoint.mode selective "
               "--activation_checkpoint.selective_ac_option op",
               8, block);
}
