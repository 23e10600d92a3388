// gpt-oss (titan's small flavor: 4 blocks of width 64, sliding windows of 8 on blocks 0 and 2,
// sinks on every head, 8 biased experts of hidden 32, top 2) in the layouts it composes with, as
// real titan-train ranks under titan-run: every rank's losses and grad norms against one process
// over 10 steps (tests/layout_check.h's tolerances: the same float32 math in another reduction
// order), and each MoE layer's expert load every step equal (integer counts summed exactly).
//
// What each layout exercises of gpt-oss: TP shards the biases and sinks with their heads and
// adds the experts' output bias once over the ranks that sum it (RoutedExperts::
// output_summed_over); EP moves the biased experts whole; CP's chunks of 8 (32 positions at CP 2)
// meet windows of 8 that cross every chunk boundary, with the sinks rescaling the merged rows, in
// the ring and in head-parallel mode; block-causal documents cut the windows further.
#include <catch2/catch.hpp>

#include <string>
#include <tuple>
#include <vector>

#include "tests/layout_check.h"

namespace layout = titan::testing::layout;
namespace fs = std::filesystem;

namespace {

const std::string kGptOss = "--model.name gpt_oss --model.flavor debugmodel_small";

void check_layouts(const std::string& shared, const std::vector<std::tuple<std::string, int, std::string>>& layouts) {
  const layout::Reference& ref = layout::reference_run(8, shared);
  const auto want = layout::expert_loads(ref.dump / "metrics.jsonl");
  REQUIRE(want.size() == 10);
  for (const auto& [name, nproc, overrides] : layouts) {
    layout::check_layout(name, nproc, overrides, 8, shared);
    const auto got = layout::expert_loads(layout::root() / name / "metrics_rank0.jsonl");
    REQUIRE(got.size() == want.size());
    for (size_t s = 0; s < got.size(); ++s) {
      INFO(name << " step " << s + 1);
      CHECK(got[s] == want[s]);
    }
  }
}

}  // namespace

TEST_CASE("gpt-oss (sinks, sliding windows, biased experts) under FSDP 2, TP 2, EP 2, PP 2, CP 2, EP 2 x TP 2 and "
          "FSDP 2 + per-op AC equals one process",
          "[moe][dist][gpt_oss]") {
  check_layouts(kGptOss,
                {
                    {"go_fsdp2", 2, ""},
                    {"go_tp2", 2, "--parallelism.tensor_parallel_degree 2"},
                    {"go_ep2", 2, "--parallelism.expert_parallel_degree 2"},
                    {"go_pp2", 2, "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule 1F1B"},
                    {"go_cp2", 2, "--parallelism.context_parallel_degree 2"},
                    {"go_ep2_tp2", 4, "--parallelism.expert_parallel_degree 2 --parallelism.tensor_parallel_degree 2"},
                    {"go_fsdp2_op_ac", 2,
                     "--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op"},
                });
}

TEST_CASE("gpt-oss block-causal under CP 2 (ring and head-parallel) equals one process", "[moe][dist][gpt_oss]") {
  check_layouts(kGptOss + " --model.attn_mask_type block_causal",
                {
                    {"go_docs_cp2", 2, "--parallelism.context_parallel_degree 2"},
                    {"go_docs_cp2_ulysses", 2,
                     "--parallelism.context_parallel_degree 2 --parallelism.context_parallel_rotate_method titan_ulysses"},
                });
}

TEST_CASE("gpt-oss with float8 rowwise dense linears and rowwise experts (EP 2 x FSDP 2 with float8 dispatch, TP 2) "
          "equals one process with the same recipes",
          "[moe][dist][gpt_oss][float8]") {
  // One process runs the same recipes, so only the reduction order differs, which can flip an
  // element's e4m3 rounding and a token's routing: the float8 layout bounds of the other MoE
  // families (5e-4 loss, 2e-3 grad norm), no load comparison.
  layout::Tolerance tol;
  tol.loss = 5e-4;
  tol.grad_norm = 2e-3;
  const std::string float8 = kGptOss +
                             " --float8.enable_float8_linear --float8.recipe_name rowwise --model.converters "
                             "quantize.grouped_mm.float8 --quantize.grouped_mm.float8.fqns experts";
  layout::check_layout("go_ep2_fsdp2_float8", 4,
                       "--parallelism.expert_parallel_degree 2 --parallelism.data_parallel_shard_degree 4 "
                       "--quantize.grouped_mm.float8.float8_dispatch",
                       8, float8, tol);
  layout::check_layout("go_tp2_float8", 2, "--parallelism.tensor_parallel_degree 2", 8, float8, tol);
}
