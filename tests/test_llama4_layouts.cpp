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

std::vector<std::vector<double>> expert_loads(const fs::path& metrics) {
  std::vector<std::vector<double>> loads;
  for (const auto& j : titan::testing::read_metrics_lines(metrics))
    if (j.contains("expert_load")) loads.push_back(j.at("expert_load").get<std::vector<double>>());
  return loads;
}

}  // namespace

TEST_CASE("Llama 4 (iRoPE chunks, interleaved MoE) under FSDP 2, TP 2, EP 2, PP 2 and CP 2 equals one process",
          "[moe][dist][llama4]") {
  const layout::Reference& ref = layout::reference_run(8, kLlama4);
  const auto want = expert_loads(ref.dump / "metrics.jsonl");
  REQUIRE(want.size() == 10);
  const std::vector<std::tuple<std::string, int, std::string>> layouts = {
      {"l4_fsdp2", 2, ""},
      {"l4_tp2", 2, "--parallelism.tensor_parallel_degree 2"},
      {"l4_ep2", 2, "--parallelism.expert_parallel_degree 2"},
      {"l4_pp2", 2, "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule 1F1B"},
      {"l4_cp2", 2, "--parallelism.context_parallel_degree 2"},
  };
  for (const auto& [name, nproc, overrides] : layouts) {
    layout::check_layout(name, nproc, overrides, 8, kLlama4);
    const auto got = expert_loads(layout::root() / name / "metrics_rank0.jsonl");
    REQUIRE(got.size() == want.size());
    for (size_t s = 0; s < got.size(); ++s) {
      INFO(name << " step " << s + 1);
      CHECK(got[s] == want[s]);
    }
  }
}
