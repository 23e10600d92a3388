// tests/test_mesh_schedule.cpp — the seams the fourth and fifth dimensions build on: the mesh's
// five dimensions and flattened views, the micro-batch schedule as a list of actions, the
// sequence split, and the pipeline schedules as data with the stage split (part of the
// test_parallel executable).
//
// The expected pipeline orders are what torch.distributed.pipelining 2.7 - 2.15 generate for the
// same (schedule, pp, stages per rank, micro-batches) (`pipeline_order` of its schedule classes,
// printed one rank per line, "_" for an idle slot), with one deliberate difference: torch numbers
// 1F1B's last-rank forwards from 1 in that (never executed) order; titan runs its order and
// numbers them from 0. The stage splits are torchtitan v0.2's generate_llm_fqn_per_model_part for
// the same inputs.
#include <catch2/catch.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/flavors.h"
#include "model/param_path.h"
#include "model/transformer.h"
#include "parallel/comm/mesh.h"
#include "parallel/pipeline/orders.h"
#include "parallel/pipeline/plan.h"
#include "parallel/pipeline/split.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/context_parallel/sequence_shard.h"
#include "tests/rank_threads.h"
#include "trainer/config/pipeline_keys.h"
#include "tests/temp_dir.h"

namespace tp = titan::parallel;
using Catch::Matchers::Contains;
using G = std::vector<std::vector<int>>;
using Kind = tp::pipeline::PipelineScheduleKind;
using Rows = std::vector<std::string>;

namespace {

// pp 2 x dp_replicate 1 x dp_shard 2 x cp 2 x tp 2 = 16 ranks. resolve_parallel_dims still
// refuses pp and cp > 1, so the degrees are set directly: the mesh arithmetic is what is tested.
tp::comm::ParallelDims five_dims() {
  tp::comm::ParallelDims d;
  d.pp = 2;
  d.dp_replicate = 1;
  d.dp_shard = 2;
  d.cp = 2;
  d.tp = 2;
  d.world_size = 16;
  return d;
}

}  // namespace

TEST_CASE("the mesh names torchtitan's five dimensions, outermost pp, innermost tp", "[parallel]") {
  const tp::comm::ParallelDims d = five_dims();
  for (int r = 0; r < 16; ++r) CHECK(tp::comm::mesh_rank(d, tp::comm::mesh_coord(d, r)) == r);
  // 13 = ((((pp 1) * 1 + dp_replicate 0) * 2 + dp_shard 1) * 2 + cp 0) * 2 + tp 1
  const tp::comm::MeshCoord c = tp::comm::mesh_coord(d, 13);
  CHECK((c.pp == 1 && c.dp_replicate == 0 && c.dp_shard == 1 && c.cp == 0 && c.tp == 1));
  CHECK(d.dp() == 2);
  CHECK(d.dp_shard_cp() == 4);
  CHECK(d.dp_cp() == 4);
  CHECK(d.non_data_parallel_size() == 8);  // pp x cp x tp: ranks that see the same tokens
  CHECK(d.describe() == "pp 2 x dp_replicate 1 x dp_shard 2 x cp 2 x tp 2 = 16 ranks");

  CHECK(tp::comm::mesh_groups(d, tp::comm::MeshDim::kTp) ==
        G{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(tp::comm::mesh_groups(d, tp::comm::MeshDim::kCp) ==
        G{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(tp::comm::mesh_groups(d, tp::comm::MeshDim::kDpShard) ==
        G{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK(tp::comm::mesh_groups(d, tp::comm::MeshDim::kPp) ==
        G{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
  // Flattened views: members row-major over (dp_shard, cp), so group rank = dp_shard * cp + cp_rank.
  CHECK(tp::comm::mesh_groups(d, tp::comm::MeshDim::kDpShardCp) == G{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  CHECK(tp::comm::mesh_groups(d, tp::comm::MeshDim::kDpCp) == tp::comm::mesh_groups(d, tp::comm::MeshDim::kDpShardCp));  // dp_replicate 1
  CHECK(tp::comm::mesh_groups(d, tp::comm::MeshDim::kDp) == tp::comm::mesh_groups(d, tp::comm::MeshDim::kDpShard));
}

TEST_CASE("a single process's mesh has every dimension of size 1 and no communicator", "[parallel]") {
  tp::comm::DeviceMesh mesh(nullptr, tp::comm::resolve_parallel_dims(1, -1, 1, 1, 1, 1));
  for (tp::comm::MeshDim dim : {tp::comm::MeshDim::kPp, tp::comm::MeshDim::kDpReplicate, tp::comm::MeshDim::kDpShard, tp::comm::MeshDim::kCp,
                          tp::comm::MeshDim::kTp, tp::comm::MeshDim::kDp, tp::comm::MeshDim::kDpShardCp, tp::comm::MeshDim::kDpCp}) {
    INFO(tp::comm::mesh_dim_name(dim));
    CHECK(mesh.comm(dim) == nullptr);
    CHECK(mesh.size(dim) == 1);
    CHECK(mesh.local_rank(dim) == 0);
  }
}

TEST_CASE("with cp 1 the flattened views share the communicators of dp_shard and dp (threads)", "[parallel]") {
  // HSDP 2 x 2: dp_shard_cp is dp_shard, dp_cp is dp; no extra process group is built.
  const tp::comm::ParallelDims dims = tp::comm::resolve_parallel_dims(2, 2, 1, 1, 1, 4);
  const std::chrono::milliseconds timeout(30000);
  const auto errors = titan::testing::run_ranks_on_threads(
      4, timeout, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
        tp::comm::CommOptions opts;
        opts.timeout = timeout;
        tp::comm::DeviceMesh mesh(std::make_unique<tp::comm::Comm>(store, rank, 4, "world", opts), dims);
        auto expect = [&](bool ok, const std::string& what) {
          if (!ok) throw std::runtime_error("rank " + std::to_string(rank) + ": " + what);
        };
        expect(mesh.comm(tp::comm::MeshDim::kDpShardCp) == mesh.comm(tp::comm::MeshDim::kDpShard), "dp_shard_cp != dp_shard");
        expect(mesh.comm(tp::comm::MeshDim::kDpCp) == mesh.comm(tp::comm::MeshDim::kDp), "dp_cp != dp");
        expect(mesh.comm(tp::comm::MeshDim::kDp) != nullptr && mesh.comm(tp::comm::MeshDim::kDp)->size() == 4, "dp size");
        expect(mesh.comm(tp::comm::MeshDim::kCp) == nullptr && mesh.comm(tp::comm::MeshDim::kPp) == nullptr, "cp/pp comm");
        expect(mesh.local_rank(tp::comm::MeshDim::kDpCp) == rank, "dp_cp rank");  // tp 1: dp_cp covers the world
        expect(mesh.local_rank(tp::comm::MeshDim::kDpShardCp) == rank % 2, "dp_shard_cp rank");
      });
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank << ": " << errors[rank]);
    CHECK(errors[rank].empty());
  }
}

TEST_CASE("schedule actions read and print as torchtitan's CSV writes them", "[parallel][schedule]") {
  const tp::pipeline::Action a = tp::pipeline::parse_action("0F1");
  CHECK((a.stage == 0 && a.type == tp::pipeline::ActionType::kForward && a.microbatch == 1));
  CHECK(tp::pipeline::parse_action("12B345").str() == "12B345");
  CHECK(tp::pipeline::parse_action("3B0") == tp::pipeline::Action{3, tp::pipeline::ActionType::kBackward, 0});
  CHECK(tp::pipeline::parse_action("2I7") == tp::pipeline::Action{2, tp::pipeline::ActionType::kBackwardInput, 7});
  CHECK(tp::pipeline::parse_action("1W0") == tp::pipeline::Action{1, tp::pipeline::ActionType::kBackwardWeight, 0});
  for (const char* bad : {"", "F1", "0X1", "0F", "0F1x", "-1F0", "0f1", "1234567F0", "0SEND_F1"}) {
    INFO("'" << bad << "'");
    CHECK_THROWS_WITH(tp::pipeline::parse_action(bad), Contains(std::string("'") + bad + "'") && Contains("<stage><F|B|I|W><micro-batch>"));
  }
  // Gradient accumulation is the one-stage schedule: each backward right after its forward.
  std::string text;
  for (const tp::pipeline::Action& action : tp::pipeline::single_stage_actions(3)) text += action.str() + " ";
  CHECK(text == "0F0 0B0 0F1 0B1 0F2 0B2 ");
}

TEST_CASE("the sequence split is the identity without context parallelism", "[parallel]") {
  tp::comm::DeviceMesh mesh(nullptr, tp::comm::resolve_parallel_dims(1, -1, 1, 1, 1, 1));
  const titan::model::RotaryTable table = titan::model::make_rotary_table(8, 16, 10000.0, c10::kCPU);
  const at::Tensor inputs = at::arange(12, at::kLong).view({2, 6});
  const at::Tensor labels = inputs + 1;
  const tp::context_parallel::SequenceShard shard = tp::context_parallel::shard_sequence(mesh, inputs, labels, {}, table);
  CHECK(at::equal(shard.inputs, inputs));
  CHECK(at::equal(shard.labels, labels));
  // Every position, in order: the table's first S rows.
  CHECK(shard.rope.cos.size(0) == 6);
  CHECK(at::equal(shard.rope.cos, table.cos.narrow(0, 0, 6)));
  CHECK(at::equal(shard.rope.sin, table.sin.narrow(0, 0, 6)));
  CHECK(!shard.documents.defined());  // a causal model has no documents
  // A block-causal model's shard carries the documents of the whole rows, from the EOS id.
  titan::model::ModelArgs block;
  block.block_causal = true;
  block.eos_id = 3;
  const tp::context_parallel::SequenceShard docs = tp::context_parallel::shard_sequence(mesh, inputs % 4, labels, block, table);
  CHECK(at::equal(docs.documents, at::tensor(std::vector<int64_t>{0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1}).view({2, 6})));
  const at::Tensor too_long = at::arange(17, at::kLong).view({1, 17});
  CHECK_THROWS_WITH(tp::context_parallel::shard_sequence(mesh, too_long, too_long, {}, table),
                    "sequence length 17 exceeds the RoPE table (16 positions = model max_seq_len)");
}

namespace {

Rows rows_of(const tp::pipeline::PipelineOrder& order) {
  Rows rows;
  for (const tp::pipeline::RankActions& actions : order) {
    std::string row;
    for (const auto& a : actions) row += (row.empty() ? "" : " ") + (a ? a->str() : std::string("_"));
    rows.push_back(row);
  }
  return rows;
}

std::string validation_error(const tp::pipeline::PipelineOrder& order, int pp, int stages, int64_t m) {
  try {
    tp::pipeline::validate_pipeline_order(order, pp, stages, m);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("pipeline schedules by torchtitan's names, placement and stages per rank", "[parallel][pipeline]") {
  CHECK(tp::pipeline::pipeline_schedule_from_name("1f1b") == Kind::k1F1B);
  CHECK(tp::pipeline::pipeline_schedule_from_name("INTERLEAVED1F1B") == Kind::kInterleaved1F1B);
  CHECK(tp::pipeline::pipeline_schedule_from_name("ZBVZeroBubble") == Kind::kZBVZeroBubble);
  CHECK_THROWS_WITH(tp::pipeline::pipeline_schedule_from_name("interleaved_1f1b"),
                    Contains("unknown pipeline schedule 'interleaved_1f1b'") &&
                        Contains("GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble"));
  CHECK_THROWS_WITH(tp::pipeline::pipeline_schedule_from_name("DualPipeV"), Contains("not supported") && Contains("MoE"));
  for (Kind kind : tp::pipeline::pipeline_schedule_kinds())
    CHECK(tp::pipeline::pipeline_schedule_from_name(tp::pipeline::pipeline_schedule_name(kind)) == kind);
  CHECK(tp::pipeline::is_single_stage(Kind::kGPipe));
  CHECK_FALSE(tp::pipeline::is_single_stage(Kind::kLoopedBFS));
  CHECK(tp::pipeline::default_stages_per_rank(Kind::k1F1B) == 1);
  CHECK(tp::pipeline::default_stages_per_rank(Kind::kInterleavedZeroBubble) == 2);
  CHECK(tp::pipeline::stages_of_rank(1, 4, 8, false) == std::vector<int>{1, 5});  // loop
  CHECK(tp::pipeline::stages_of_rank(1, 4, 8, true) == std::vector<int>{1, 6});   // V
  CHECK(tp::pipeline::stages_of_rank(2, 3, 9, false) == std::vector<int>{2, 5, 8});
  CHECK_THROWS_WITH(tp::pipeline::stages_of_rank(0, 4, 6, false), Contains("6 pipeline stages cannot be spread evenly over 4 ranks"));
  CHECK_THROWS_WITH(tp::pipeline::stages_of_rank(0, 2, 6, true), Contains("exactly 2 stages on each rank, got 3"));
}

TEST_CASE("generated orders are torch's, slot for slot", "[parallel][pipeline]") {
  CHECK(rows_of(tp::pipeline::pipeline_order(Kind::kGPipe, 2, 1, 4)) ==
        Rows{"0F0 0F1 0F2 0F3 _ _ _ 0B0 0B1 0B2 0B3", "_ 1F0 1F1 1F2 1F3 1B0 1B1 1B2 1B3"});
  CHECK(rows_of(tp::pipeline::pipeline_order(Kind::k1F1B, 2, 1, 4)) ==
        Rows{"0F0 _ _ 0F1 0B0 0F2 0B1 0F3 0B2 _ 0B3", "_ 1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3"});
  CHECK(rows_of(tp::pipeline::pipeline_order(Kind::k1F1B, 3, 1, 5)) ==
        Rows{"0F0 0F1 _ _ _ _ 0F2 0B0 0F3 0B1 0F4 0B2 _ 0B3 _ 0B4", "_ 1F0 _ _ 1F1 1B0 1F2 1B1 1F3 1B2 1F4 1B3 _ 1B4",
             "_ _ 2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3 2F4 2B4"});
  CHECK(rows_of(tp::pipeline::pipeline_order(Kind::kInterleaved1F1B, 2, 2, 4)) ==
        Rows{"0F0 0F1 2F0 2F1 _ _ 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 _ 2B2 _ 2B3 _ 0B2 _ 0B3",
             "_ 1F0 1F1 _ 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 _ 1B2 _ 1B3"});
  CHECK(rows_of(tp::pipeline::pipeline_order(Kind::kInterleaved1F1B, 4, 2, 8)) ==
        Rows{"0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 0F4 0F5 _ _ _ _ 0F6 4B0 0F7 4B1 4F4 4B2 4F5 4B3 4F6 0B0 4F7 0B1 _ 0B2 _ "
             "0B3 _ 4B4 _ 4B5 _ 4B6 _ 4B7 _ 0B4 _ 0B5 _ 0B6 _ 0B7",
             "_ 1F0 1F1 1F2 1F3 5F0 5F1 5F2 5F3 _ _ _ 1F4 5B0 1F5 5B1 1F6 5B2 1F7 5B3 5F4 1B0 5F5 1B1 5F6 1B2 5F7 1B3 _ "
             "5B4 _ 5B5 _ 5B6 _ 5B7 _ 1B4 _ 1B5 _ 1B6 _ 1B7",
             "_ _ 2F0 2F1 2F2 2F3 6F0 6F1 _ _ 6F2 6B0 6F3 6B1 2F4 6B2 2F5 6B3 2F6 2B0 2F7 2B1 6F4 2B2 6F5 2B3 6F6 6B4 6F7 "
             "6B5 _ 6B6 _ 6B7 _ 2B4 _ 2B5 _ 2B6 _ 2B7",
             "_ _ _ 3F0 3F1 3F2 3F3 _ 7F0 7B0 7F1 7B1 7F2 7B2 7F3 7B3 3F4 3B0 3F5 3B1 3F6 3B2 3F7 3B3 7F4 7B4 7F5 7B5 7F6 "
             "7B6 7F7 7B7 _ 3B4 _ 3B5 _ 3B6 _ 3B7"});
  CHECK(rows_of(tp::pipeline::pipeline_order(Kind::kLoopedBFS, 2, 2, 4)) ==
        Rows{"0F0 0F1 0F2 0F3 2F0 2F1 2F2 2F3 _ _ 2B3 2B2 2B1 2B0 0B3 0B2 0B1 0B0",
             "_ 1F0 1F1 1F2 1F3 3F0 3F1 3F2 3F3 3B3 3B2 3B1 3B0 1B3 1B2 1B1 1B0"});
  CHECK(rows_of(tp::pipeline::pipeline_order(Kind::kLoopedBFS, 3, 3, 2)) ==
        Rows{"0F0 0F1 3F0 3F1 6F0 6F1 _ _ _ _ 6B1 6B0 3B1 3B0 0B1 0B0", "_ 1F0 1F1 4F0 4F1 7F0 7F1 _ _ 7B1 7B0 4B1 4B0 1B1 1B0",
             "_ _ 2F0 2F1 5F0 5F1 8F0 8F1 8B1 8B0 5B1 5B0 2B1 2B0"});
  CHECK(rows_of(tp::pipeline::pipeline_order(Kind::kInterleavedZeroBubble, 2, 2, 4)) ==
        Rows{"0F0 0F1 2F0 _ 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 0I2 0W2 0I3 0W3",
             "_ 1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 1W2 1W3"});
  CHECK(rows_of(tp::pipeline::pipeline_order(Kind::kInterleavedZeroBubble, 3, 2, 6)) ==
        Rows{"0F0 0F1 0F2 3F0 3F1 _ _ 3F2 3I0 3W0 0F3 3I1 3W1 0F4 3I2 3W2 0F5 0I0 0W0 3F3 0I1 0W1 3F4 0I2 0W2 3F5 3I3 "
             "3W3 3I4 3W4 3I5 3W5 0I3 0W3 0I4 0W4 0I5 0W5",
             "_ 1F0 1F1 1F2 4F0 _ 4F1 4I0 4F2 4I1 4W0 1F3 4I2 4W1 1F4 1I0 4W2 1F5 1I1 1W0 4F3 1I2 1W1 4F4 4I3 1W2 4F5 4I4 "
             "4W3 4I5 4W4 1I3 4W5 1I4 1W3 1I5 1W4 1W5",
             "_ _ 2F0 2F1 2F2 5F0 5I0 5F1 5I1 5F2 5I2 5W0 2F3 2I0 5W1 2F4 2I1 5W2 2F5 2I2 2W0 5F3 5I3 2W1 5F4 5I4 2W2 5F5 "
             "5I5 5W3 2I3 5W4 2I4 5W5 2I5 2W3 2W4 2W5"});
  CHECK(rows_of(tp::pipeline::pipeline_order(Kind::kZBVZeroBubble, 2, 2, 4)) ==
        Rows{"0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3",
             "_ 1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3"});
  CHECK(rows_of(tp::pipeline::pipeline_order(Kind::kZBVZeroBubble, 3, 2, 5)) ==
        Rows{"0F0 0F1 0F2 0F3 0F4 5F0 5I0 5W0 5F1 5I1 5W1 5F2 5I2 5W2 0I0 0W0 5F3 5I3 5W3 0I1 0W1 5F4 5I4 5W4 0I2 0W2 "
             "0I3 0W3 0I4 0W4",
             "_ 1F0 1F1 1F2 4F0 1F3 4F1 4I0 4W0 4F2 4I1 4W1 1F4 1I0 1W0 4F3 4I2 4W2 1I1 1W1 4F4 4I3 4W3 1I2 4I4 1I3 1W2 "
             "1I4 1W3 4W4 1W4",
             "_ _ 2F0 3F0 2F1 3F1 2F2 3F2 3I0 3W0 2F3 2I0 2W0 3F3 3I1 3W1 2F4 2I1 2W1 3F4 3I2 3W2 2I2 3I3 2I3 3I4 2I4 2W2 "
             "3W3 3W4 2W3 2W4"});
}

TEST_CASE("every generated order is a complete schedule for many shapes", "[parallel][pipeline]") {
  int checked = 0;
  for (Kind kind : tp::pipeline::pipeline_schedule_kinds())
    for (int pp = 2; pp <= 5; ++pp)
      for (int per_rank = 1; per_rank <= 4; ++per_rank)
        for (int64_t m = 1; m <= 12; ++m) {
          try {
            tp::pipeline::check_pipeline_schedule(kind, pp, per_rank, m);
          } catch (const std::invalid_argument&) {
            continue;  // a combination torch refuses too (tested below)
          }
          INFO(tp::pipeline::pipeline_schedule_name(kind) << " pp " << pp << " x " << per_rank << " stages, m " << m);
          const tp::pipeline::PipelineOrder order = tp::pipeline::pipeline_order(kind, pp, per_rank, m);
          const std::vector<int> owner = tp::pipeline::validate_pipeline_order(order, pp, pp * per_rank, m);
          for (int r = 0; r < pp; ++r)
            for (int s : tp::pipeline::stages_of_rank(r, pp, pp * per_rank, tp::pipeline::uses_v_placement(kind)))
              CHECK(owner[static_cast<size_t>(s)] == r);  // the order runs each stage where placement puts it
          ++checked;
        }
  CHECK(checked > 300);
}

TEST_CASE("schedule constraints are refused with torch's reasons", "[parallel][pipeline]") {
  CHECK_THROWS_WITH(tp::pipeline::check_pipeline_schedule(Kind::k1F1B, 4, 1, 3),
                    Contains("number of microbatches (3) must be greater than or equal to the number of stages (4)"));
  CHECK_THROWS_WITH(tp::pipeline::check_pipeline_schedule(Kind::kGPipe, 2, 1, 1), Contains("(1) must be greater than or equal"));
  // Interleaved: m a multiple of the rounds max(1, m / pp): pp 4 takes m 10 (2 rounds of 5) and 3, not 9.
  CHECK_NOTHROW(tp::pipeline::check_pipeline_schedule(Kind::kInterleaved1F1B, 4, 2, 10));
  CHECK_NOTHROW(tp::pipeline::check_pipeline_schedule(Kind::kInterleaved1F1B, 4, 2, 3));
  CHECK_THROWS_WITH(tp::pipeline::check_pipeline_schedule(Kind::kInterleaved1F1B, 4, 2, 9),
                    Contains("multiple of the number of rounds (2") && Contains("but got 9"));
  CHECK_THROWS_WITH(tp::pipeline::check_pipeline_schedule(Kind::kInterleavedZeroBubble, 4, 2, 9), Contains("rounds (2"));
  CHECK_THROWS_WITH(tp::pipeline::check_pipeline_schedule(Kind::kZBVZeroBubble, 2, 3, 8),
                    Contains("requires exactly 2 stages per rank, but got 3"));
  CHECK_THROWS_WITH(tp::pipeline::check_pipeline_schedule(Kind::kGPipe, 2, 2, 8), Contains("exactly 1 stage per rank, got 2"));
  CHECK_THROWS_WITH(tp::pipeline::check_pipeline_schedule(Kind::kLoopedBFS, 2, 1, 8), Contains("at least 2 stages per rank, got 1"));
}

TEST_CASE("a CSV schedule reads back, and a broken one is named by row, column or stage", "[parallel][pipeline]") {
  const tp::pipeline::PipelineOrder zbv = tp::pipeline::pipeline_order(Kind::kZBVZeroBubble, 2, 2, 4);
  const std::string csv = tp::pipeline::pipeline_order_csv(zbv);
  CHECK(csv.rfind("0F0,0F1,0F2,3F0,", 0) == 0);
  CHECK(csv.find("\n,1F0,2F0,") != std::string::npos);  // rank 1 starts idle
  CHECK(rows_of(tp::pipeline::parse_pipeline_csv(csv, "zbv.csv")) == rows_of(zbv));
  CHECK(rows_of(tp::pipeline::parse_pipeline_csv(" 0F0 , 0B0 \r\n,1F0,1B0\n", "f")) == Rows{"0F0 0B0", "_ 1F0 1B0"});

  const std::filesystem::path dir = titan::testing::fresh_temp_dir("pipeline_csv");
  const std::string path = (dir / "schedule.csv").string();
  std::ofstream(path) << "0F0,0B0,0F1,0B1\n,1F0,1B0,1F1,1B1\n";
  CHECK(tp::pipeline::validate_pipeline_order(tp::pipeline::read_pipeline_csv(path), 2, 2, 2) == std::vector<int>{0, 1});
  CHECK_THROWS_WITH(tp::pipeline::read_pipeline_csv((dir / "missing.csv").string()),
                    Contains("pipeline schedule file '") && Contains("missing.csv' does not exist"));
  CHECK_THROWS_WITH(tp::pipeline::read_pipeline_csv(dir.string()), Contains("is a directory"));

  CHECK_THROWS_WITH(tp::pipeline::parse_pipeline_csv("0F0,0X0\n", "s.csv"),
                    Contains("s.csv: row 0 (rank 0), column 1: schedule action '0X0'"));
  CHECK_THROWS_WITH(tp::pipeline::parse_pipeline_csv("0F0,0SEND_F0\n", "s.csv"),
                    Contains("column 1: communication action '0SEND_F0'") && Contains("compute actions only"));
  CHECK_THROWS_WITH(tp::pipeline::parse_pipeline_csv("", "s.csv"), Contains("s.csv: the schedule file is empty"));

  auto parse = [](const std::string& text) { return tp::pipeline::parse_pipeline_csv(text, "t"); };
  CHECK(validation_error(parse("0F0,0B0\n"), 2, 2, 1) == "the schedule has 1 ranks, the pipeline 2 (pipeline_parallel_degree)");
  CHECK_THAT(validation_error(parse("0B0,0F0\n1F0,1B0\n"), 2, 2, 1),
             Contains("rank 0, step 0: 0B0: a backward of stage 0, micro-batch 0 without first running its forward"));
  CHECK_THAT(validation_error(parse("0F0,0W0,0I0\n1F0,1B0\n"), 2, 2, 1),
             Contains("rank 0, step 1: 0W0: a weight backward (W)") && Contains("without first running its input backward (I)"));
  CHECK_THAT(validation_error(parse("0F0,0B0\n1B0,1F0\n"), 2, 2, 1),
             Contains("rank 1, step 0: 1B0: a backward of stage 1, micro-batch 0 without first running its forward"));
  CHECK_THAT(validation_error(parse("0F0,0B0,1F0,1B0\n1F0\n"), 2, 2, 1), Contains("rank 1, step 0: 1F0: runs a second time"));
  CHECK_THAT(validation_error(parse("0F0,0B0\n1F0,1B0,0F1\n"), 2, 2, 2), Contains("stage 0 is assigned to both rank 0 and rank 1"));
  CHECK_THAT(validation_error(parse("0F0,0B0,0F1\n1F0,1B0,1F1,1B1\n"), 2, 2, 2), Contains("stage 0: expected 2 backwards, got B=1"));
  CHECK_THAT(validation_error(parse("0F0,0B0,0F3\n1F0,1B0\n"), 2, 2, 1), Contains("micro-batch 3 does not exist (1 micro-batches)"));
  CHECK_THAT(validation_error(parse("0F0,0B0\n5F0\n"), 2, 2, 1), Contains("stage 5 does not exist (stages 0..1)"));
  CHECK_THAT(validation_error(parse("0F0,0I0\n1F0,1B0\n"), 2, 2, 1), Contains("stage 0: I and W must come in pairs, got I=1, W=0"));
  CHECK_THAT(validation_error(parse("0F0,0B0\n\n"), 2, 2, 1), Contains("stage 1: no rank runs it"));
}

TEST_CASE("the plan's table of a schedule: one row per step, one column per rank", "[parallel][pipeline]") {
  CHECK(tp::pipeline::format_pipeline_order(tp::pipeline::pipeline_order(Kind::k1F1B, 2, 1, 2)) ==
        "        Rank 0 Rank 1\n"
        "Step 0: 0F0          \n"
        "Step 1:        1F0   \n"
        "Step 2:        1B0   \n"
        "Step 3: 0F1    1F1   \n"
        "Step 4: 0B0    1B1   \n"
        "Step 5:              \n"
        "Step 6: 0B1          \n");
}

TEST_CASE("stages split the model as torchtitan does", "[parallel][pipeline]") {
  using S = tp::pipeline::StageModules;
  CHECK(tp::pipeline::module_fqns_per_stage(2, 6, 1, 1) ==
        S{{"tok_embeddings", "layers.0", "layers.1", "layers.2"}, {"layers.3", "layers.4", "layers.5", "norm", "output"}});
  CHECK(tp::pipeline::module_fqns_per_stage(4, 6, 1, 1) ==
        S{{"tok_embeddings", "layers.0"}, {"layers.1", "layers.2"}, {"layers.3", "layers.4"}, {"layers.5", "norm", "output"}});
  CHECK(tp::pipeline::module_fqns_per_stage(3, 6, 2, 1) ==
        S{{"tok_embeddings", "layers.0"}, {"layers.1", "layers.2", "layers.3"}, {"layers.4", "layers.5", "norm", "output"}});
  const S eight = tp::pipeline::module_fqns_per_stage(8, 32, 1, 1);  // Llama 3 8B, Interleaved1F1B over pp 4
  REQUIRE(eight.size() == 8);
  CHECK(eight[0] == std::vector<std::string>{"tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3"});
  CHECK(eight[1] == std::vector<std::string>{"layers.4", "layers.5", "layers.6", "layers.7", "layers.8"});
  CHECK(eight[2] == std::vector<std::string>{"layers.9", "layers.10", "layers.11", "layers.12"});
  CHECK(eight[7] == std::vector<std::string>{"layers.29", "layers.30", "layers.31", "norm", "output"});
  CHECK(tp::pipeline::module_fqns_per_stage(1, 2, 1, 1) == S{{"tok_embeddings", "layers.0", "layers.1", "norm", "output"}});
  for (int stages = 1; stages <= 8; ++stages) CHECK_NOTHROW(tp::pipeline::check_stage_modules(tp::pipeline::module_fqns_per_stage(stages, 6, 1, 1), 6));
  CHECK_THROWS_WITH(tp::pipeline::module_fqns_per_stage(9, 6, 1, 1), Contains("(9) cannot be greater than the effective layers (8"));
  CHECK_THROWS_WITH(tp::pipeline::module_fqns_per_stage(4, 6, 3, 1), Contains("first_stage_less_layers (3) exceeds the layers per stage (2)"));

  // torchtitan v0.1's split points: each starts a stage.
  CHECK(tp::pipeline::module_fqns_from_split_points({"layers.2", "layers.4"}, 6) ==
        S{{"tok_embeddings", "layers.0", "layers.1"}, {"layers.2", "layers.3"}, {"layers.4", "layers.5", "norm", "output"}});
  CHECK_THROWS_WITH(tp::pipeline::module_fqns_from_split_points({"layers.4", "layers.2"}, 6), Contains("'layers.2' does not come after"));
  CHECK_THROWS_WITH(tp::pipeline::module_fqns_from_split_points({"layer.2"}, 6), Contains("'layer.2' is not a layer of the model"));
  CHECK_THROWS_WITH(tp::pipeline::module_fqns_from_split_points({"layers.6"}, 6), Contains("(layers.0 .. layers.5)"));

  CHECK_THROWS_WITH(tp::pipeline::check_stage_modules({{"tok_embeddings", "layers.1"}, {"layers.0", "norm", "output"}}, 2),
                    Contains("pipeline stage 0: 'layers.1' where 'layers.0' comes next"));
  CHECK_THROWS_WITH(tp::pipeline::check_stage_modules({{"tok_embeddings", "layers.0"}, {}, {"layers.1", "norm", "output"}}, 2),
                    Contains("pipeline stage 1 holds no module"));
  CHECK_THROWS_WITH(tp::pipeline::check_stage_modules({{"tok_embeddings", "layers.0", "layers.1", "norm"}}, 2),
                    Contains("leave out 'output'"));

  // The stage count: pp x 1 or 2 by default; with layers_per_stage, ceil((layers + 2) / k).
  CHECK(tp::pipeline::pipeline_stage_count(Kind::k1F1B, 4, 32, 0, 1, 1) == 4);
  CHECK(tp::pipeline::pipeline_stage_count(Kind::kInterleaved1F1B, 4, 32, 0, 1, 1) == 8);
  CHECK(tp::pipeline::pipeline_stage_count(Kind::kInterleaved1F1B, 4, 30, 4, 1, 1) == 8);
  CHECK_THROWS_WITH(tp::pipeline::pipeline_stage_count(Kind::kInterleaved1F1B, 4, 30, 5, 1, 1),
                    Contains("must be a multiple of pipeline_parallel_degree") && Contains("7 stages over 4 pipeline ranks"));
  CHECK_THROWS_WITH(tp::pipeline::pipeline_stage_count(Kind::k1F1B, 2, 6, 2, 1, 1), Contains("1F1B runs exactly 1 stage per rank, but the split gives 2"));
  CHECK_THROWS_WITH(tp::pipeline::pipeline_stage_count(Kind::kLoopedBFS, 2, 6, 4, 1, 1), Contains("at least 2 stages per rank, but the split gives 1"));
}

namespace {

// Each rank's cost under a split: its stages' blocks, the embedding on stage 0, the output on the last.
std::vector<double> rank_costs(const tp::pipeline::StageModules& stages, const std::vector<int>& stage_rank,
                               const tp::pipeline::ModuleFlops& costs) {
  std::vector<double> load(static_cast<size_t>(*std::max_element(stage_rank.begin(), stage_rank.end()) + 1), 0.0);
  for (size_t s = 0; s < stages.size(); ++s)
    for (const std::string& m : stages[s])
      load[static_cast<size_t>(stage_rank[s])] +=
          m == "tok_embeddings" ? costs.embedding
          : m == "output"       ? costs.output
          : m == "norm"         ? 0.0
          : costs.per_block.empty()
              ? costs.block
              : costs.per_block[static_cast<size_t>(titan::model::parse_layer_path(m).value().layer)];
  return load;
}

// The smallest largest rank cost over every split (first and last stage may hold no block, the
// others at least one), by enumeration.
double best_largest_rank_cost(const std::vector<int>& stage_rank, int64_t n_layers, const tp::pipeline::ModuleFlops& c) {
  const size_t num_stages = stage_rank.size();
  std::vector<int64_t> blocks(num_stages, 0);
  double best = 1e300;
  std::function<void(size_t, int64_t)> place = [&](size_t s, int64_t left) {
    if (s + 1 == num_stages) {
      blocks[s] = left;
      std::vector<double> load(num_stages, 0.0);
      int64_t next = 0;
      for (size_t t = 0; t < num_stages; ++t)
        for (int64_t b = 0; b < blocks[t]; ++b, ++next)
          load[static_cast<size_t>(stage_rank[t])] += c.per_block.empty() ? c.block : c.per_block[static_cast<size_t>(next)];
      load[static_cast<size_t>(stage_rank.front())] += c.embedding;
      load[static_cast<size_t>(stage_rank.back())] += c.output;
      best = std::min(best, *std::max_element(load.begin(), load.end()));
      return;
    }
    for (int64_t b = s == 0 ? 0 : 1; b <= left; ++b) blocks[s] = b, place(s + 1, left - b);
  };
  place(0, n_layers);
  return best;
}

}  // namespace

TEST_CASE("the FLOP-balanced split: every rank's stages cost the least possible largest load", "[parallel][pipeline]") {
  using S = tp::pipeline::StageModules;
  tp::pipeline::ModuleFlops debug;  // the debug model at seq 32: the output is 0.6 of a block
  debug.block = 1.0, debug.output = 0.6, debug.embedding = 0.0;
  // ZBV over 2 ranks (rank 0 holds stages 0 and 3): torchtitan's split gives rank 0 two blocks
  // and the output, rank 1 four blocks; this one three and three.
  CHECK(tp::pipeline::module_fqns_balanced({0, 1, 1, 0}, 6, debug) ==
        S{{"tok_embeddings", "layers.0", "layers.1"}, {"layers.2", "layers.3"}, {"layers.4"},
          {"layers.5", "norm", "output"}});
  // 1F1B over 2: the output's stage holds fewer blocks only when it costs a block or more.
  CHECK(tp::pipeline::module_fqns_balanced({0, 1}, 6, debug) ==
        S{{"tok_embeddings", "layers.0", "layers.1", "layers.2"}, {"layers.3", "layers.4", "layers.5", "norm", "output"}});
  tp::pipeline::ModuleFlops llama8b;  // Llama 3 8B at short sequences: the output is 2.4 blocks
  llama8b.output = 2.4;
  const S eight = tp::pipeline::module_fqns_balanced({0, 1, 2, 3}, 32, llama8b);
  // 32 blocks + 2.4 over 4 ranks: 9, 9, 8 blocks and 6 + the output (8.4).
  CHECK(rank_costs(eight, {0, 1, 2, 3}, llama8b) == std::vector<double>{9.0, 9.0, 8.0, 6.0 + 2.4});
  // Stages between the ends need a block: ZBV over 4 ranks (8 stages) of 6 blocks leaves the
  // embedding and the output alone on their stages, as torchtitan's split does.
  const S v4 = tp::pipeline::module_fqns_balanced({0, 1, 2, 3, 3, 2, 1, 0}, 6, debug);
  CHECK(v4.front() == std::vector<std::string>{"tok_embeddings"});
  CHECK(v4.back() == std::vector<std::string>{"norm", "output"});
  // Through the plan: ZBV over 4 ranks of the 6-block debug model (8 stages, more than its blocks).
  tp::pipeline::PipelineConfig zbv4;
  zbv4.schedule = "ZBVZeroBubble", zbv4.stage_balance = "flops", zbv4.module_flops = debug;
  const tp::pipeline::PipelinePlan plan4 = tp::pipeline::plan_pipeline(zbv4, 4, 6, 8);
  CHECK(*plan4.stage_modules == v4);
  CHECK(plan4.stage_parts.size() == 8);
  CHECK_THROWS_WITH(tp::pipeline::module_fqns_balanced({0, 1, 2, 3, 3, 2, 1, 0}, 5, debug),
                    Contains("needs a block on every stage between the first and the last: 8 stages for 5 layers"));
  // Refused from the stage count alone, before a schedule places the stages: 2^40 micro-batches
  // would be an order of terabytes (the layout planner asks for such splits by the thousand).
  CHECK_THROWS_WITH(tp::pipeline::plan_pipeline(zbv4, 4, 5, int64_t{1} << 40),
                    Contains("needs a block on every stage between the first and the last: 8 stages for 5 layers"));
  // What a debug model's module costs per token at seq 2048 (dim 256, ffn 768, 16 heads of 16,
  // vocab 2048): a block 6 x 852,480 weights + half of 12 x 16 x 16 x 2048 for attention, the
  // output 6 x 256 x 2048, the embedding nothing.
  const tp::pipeline::ModuleFlops flops =
      titan::trainer::config::module_flops(titan::model::model_flavor("llama3", "debugmodel"), 2048);
  CHECK(flops.block == 6.0 * 852480 + 0.5 * 12 * 16 * 16 * 2048);
  CHECK(flops.output == 6.0 * 256 * 2048);
  CHECK(flops.embedding == 0.0);
  // Against enumeration: single-stage, looped and V placements, several cost mixes.
  const std::vector<std::vector<int>> placements = {{0, 1}, {0, 1, 2}, {0, 1, 0, 1}, {0, 1, 1, 0}, {0, 1, 2, 2, 1, 0},
                                                    {0, 1, 2, 0, 1, 2}};
  for (const auto& stage_rank : placements)
    for (int64_t n_layers = static_cast<int64_t>(stage_rank.size()); n_layers <= 9; ++n_layers)
      for (const double output : {0.0, 0.3, 0.6, 1.0, 2.4})
        for (const double embedding : {0.0, 0.5}) {
          tp::pipeline::ModuleFlops c;
          c.output = output, c.embedding = embedding;
          const S split = tp::pipeline::module_fqns_balanced(stage_rank, n_layers, c);
          CHECK_NOTHROW(tp::pipeline::check_stage_modules(split, n_layers));
          const std::vector<double> load = rank_costs(split, stage_rank, c);
          INFO("stages " << stage_rank.size() << ", " << n_layers << " layers, output " << output << ", embedding "
                         << embedding);
          // Sums of the same few terms: equal up to rounding.
          CHECK(*std::max_element(load.begin(), load.end()) ==
                Approx(best_largest_rank_cost(stage_rank, n_layers, c)).epsilon(1e-12));
        }
}

TEST_CASE("the FLOP-balanced split of blocks that cost differently (dense, then MoE)", "[parallel][pipeline]") {
  using S = tp::pipeline::StageModules;
  // A dense first block costing 3 MoE blocks, then five of 1: over 2 stages the even count (3 + 3
  // blocks) would load the first rank 5 and the second 3; by cost, 2 + 4 blocks load both 4.
  tp::pipeline::ModuleFlops c;
  c.per_block = {3, 1, 1, 1, 1, 1};
  CHECK(tp::pipeline::module_fqns_balanced({0, 1}, 6, c) ==
        S{{"tok_embeddings", "layers.0", "layers.1"}, {"layers.2", "layers.3", "layers.4", "layers.5", "norm", "output"}});
  // One stage per rank: the bisected bound with greedy stages is the classic partition, the
  // enumeration's optimum. Several stages per rank: never below it, and within the largest
  // block's cost of it (the greedy's first stage of a rank may take what a later one needed).
  const std::vector<std::vector<int>> placements = {{0, 1}, {0, 1, 2}, {0, 1, 2, 3}, {0, 1, 0, 1}, {0, 1, 1, 0},
                                                    {0, 1, 2, 2, 1, 0}};
  const std::vector<std::vector<double>> mixes = {{3, 1, 1, 1, 1, 1, 1, 1, 1}, {2, 2, 1, 1, 1, 1, 1, 1, 1},
                                                  {1, 2.5, 0.5, 1, 1.5, 1, 1, 0.7, 1.3}};
  for (const auto& stage_rank : placements)
    for (const auto& mix : mixes)
      for (int64_t n_layers = static_cast<int64_t>(stage_rank.size()); n_layers <= 9; ++n_layers)
        for (const double output : {0.0, 0.6, 2.4}) {
          tp::pipeline::ModuleFlops m;
          m.output = output;
          m.per_block.assign(mix.begin(), mix.begin() + n_layers);
          const S split = tp::pipeline::module_fqns_balanced(stage_rank, n_layers, m);
          CHECK_NOTHROW(tp::pipeline::check_stage_modules(split, n_layers));
          const std::vector<double> load = rank_costs(split, stage_rank, m);
          const double got = *std::max_element(load.begin(), load.end());
          const double best = best_largest_rank_cost(stage_rank, n_layers, m);
          INFO("stages " << stage_rank.size() << ", " << n_layers << " layers, output " << output << ": largest rank load "
                         << got << ", best " << best);
          // Bisection to 2^-60 of the whole cost: equal up to that.
          CHECK(got >= best - 1e-9);
          const bool single_stage = std::set<int>(stage_rank.begin(), stage_rank.end()).size() == stage_rank.size();
          if (single_stage) CHECK(got == Approx(best).epsilon(1e-9));
          else CHECK(got <= best + *std::max_element(m.per_block.begin(), m.per_block.end()) + 1e-9);
        }
  // Through the config: DeepSeek-V3's dense first block and its MoE blocks cost apart; Llama's
  // blocks are alike (one cost: the even split as before).
  const auto ds3 = titan::trainer::config::module_flops(titan::model::model_flavor("deepseek_v3", "debugmodel_small"), 128);
  REQUIRE(ds3.per_block.size() == 4);
  CHECK(ds3.per_block[0] > ds3.per_block[1]);
  CHECK(ds3.per_block[1] == ds3.per_block[3]);
  CHECK(titan::trainer::config::module_flops(titan::model::model_flavor("llama3", "debugmodel"), 2048).per_block.empty());
}
