// Llama 4 (titan's small iRoPE flavor: NoPE blocks 0 and 2 over each document, RoPE blocks 1 and 3
// within chunks of 12 positions; dense blocks 0 and 2, MoE blocks 1 and 3 of 8 experts, top 1, a
// shared expert) in the layouts it composes with, as real titan-train ranks under titan-run: every
// rank's losses and grad norms against one process over 10 steps (tests/layout_check.h's
// tolerances: the same float32 math in another reduction order), and each MoE layer's expert load
// every step equal (integer counts summed exactly: one token routed elsewhere would show).
//
// Context parallelism: the chunks of 12 cut the 32-position rows at 12 and 24, inside the
// load-balanced CP 2 chunks of 8 (a chunk boundary needs no alignment: each rank's attention
// tiles come from the whole rows' chunked documents).
#include <catch2/catch.hpp>

#include <string>
#include <tuple>
#include <vector>

#include "tests/layout_check.h"

namespace layout = titan::testing::layout;
namespace fs = std::filesystem;

namespace {

const std::string kLlama4 = "--model.name llama4 --model.flavor debugmodel_small_irope";

}  // namespace

TEST_CASE("Llama 4 (iRoPE chunks, interleaved MoE) under FSDP 2, TP 2, EP 2, PP 2, CP 2, HSDP 2 x 2, EP 2 x TP 2 and "
          "FSDP 2 + per-op AC equals one process",
          "[moe][dist][llama4]") {
  const layout::Reference& ref = layout::reference_run(8, kLlama4);
  const auto want = layout::expert_loads(ref.dump / "metrics.jsonl");
  REQUIRE(want.size() == 10);
  const std::vector<std::tuple<std::string, int, std::string>> layouts = {
      {"l4_fsdp2", 2, ""},
      {"l4_tp2", 2, "--parallelism.tensor_parallel_degree 2"},
      {"l4_ep2", 2, "--parallelism.expert_parallel_degree 2"},
      {"l4_pp2", 2, "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule 1F1B"},
      {"l4_cp2", 2, "--parallelism.context_parallel_degree 2"},
      {"l4_hsdp", 4, "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2"},
      {"l4_ep2_tp2", 4, "--parallelism.expert_parallel_degree 2 --parallelism.tensor_parallel_degree 2"},
      {"l4_fsdp2_op_ac", 2, "--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op"},
  };
  for (const auto& [name, nproc, overrides] : layouts) {
    layout::check_layout(name, nproc, overrides, 8, kLlama4);
    const auto got = layout::expert_loads(layout::root() / name / "metrics_rank0.jsonl");
    REQUIRE(got.size() == want.size());
    for (size_t s = 0; s < got.size(); ++s) {
      INFO(name << " step " << s + 1);
      CHECK(got[s] == want[s]);
    }
  }
}

TEST_CASE("Llama 4 with float8 rowwise dense linears and rowwise experts (EP 2 x FSDP 2 with float8 dispatch, TP 2) "
          "equals one process with the same recipes",
          "[moe][dist][llama4][float8]") {
  // One process runs the same recipes, so only the reduction order differs, which can flip an
  // element's e4m3 rounding and a token's routing: the float8 layout bounds of the other MoE
  // families (5e-4 loss, 2e-3 grad norm), no load comparison.
  layout::Tolerance tol;
  tol.loss = 5e-4;
  tol.grad_norm = 2e-3;
  const std::string float8 = kLlama4 +
                             " --float8.enable_float8_linear --float8.recipe_name rowwise --model.converters "
                             "quantize.grouped_mm.float8 --quantize.grouped_mm.float8.fqns experts";
  layout::check_layout("l4_ep2_fsdp2_float8", 4,
                       "--parallelism.expert_parallel_degree 2 --parallelism.data_parallel_shard_degree 4 "
                       "--quantize.grouped_mm.float8.float8_dispatch",
                       8, float8, tol);
  layout::check_layout("l4_tp2_float8", 2, "--parallelism.tensor_parallel_degree 2", 8, float8, tol);
}
