// tests/test_mesh_schedule.cpp — the seams the fourth and fifth dimensions build on: the mesh's
// five dimensions and flattened views, the micro-batch schedule as a list of actions, and the
// sequence split (part of the test_parallel executable).
#include <catch2/catch.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "model/llama.h"
#include "parallel/mesh.h"
#include "parallel/schedule.h"
#include "parallel/sequence_shard.h"
#include "tests/rank_threads.h"

namespace tp = titan::parallel;
using Catch::Matchers::Contains;
using G = std::vector<std::vector<int>>;

namespace {

// pp 2 x dp_replicate 1 x dp_shard 2 x cp 2 x tp 2 = 16 ranks. resolve_parallel_dims still
// refuses pp and cp > 1, so the degrees are set directly: the mesh arithmetic is what is tested.
tp::ParallelDims five_dims() {
  tp::ParallelDims d;
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
  const tp::ParallelDims d = five_dims();
  for (int r = 0; r < 16; ++r) CHECK(tp::mesh_rank(d, tp::mesh_coord(d, r)) == r);
  // 13 = ((((pp 1) * 1 + dp_replicate 0) * 2 + dp_shard 1) * 2 + cp 0) * 2 + tp 1
  const tp::MeshCoord c = tp::mesh_coord(d, 13);
  CHECK((c.pp == 1 && c.dp_replicate == 0 && c.dp_shard == 1 && c.cp == 0 && c.tp == 1));
  CHECK(d.dp() == 2);
  CHECK(d.dp_shard_cp() == 4);
  CHECK(d.dp_cp() == 4);
  CHECK(d.non_data_parallel_size() == 8);  // pp x cp x tp: ranks that see the same tokens
  CHECK(d.describe() == "pp 2 x dp_replicate 1 x dp_shard 2 x cp 2 x tp 2 = 16 ranks");

  CHECK(tp::mesh_groups(d, tp::MeshDim::kTp) ==
        G{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(tp::mesh_groups(d, tp::MeshDim::kCp) ==
        G{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(tp::mesh_groups(d, tp::MeshDim::kDpShard) ==
        G{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK(tp::mesh_groups(d, tp::MeshDim::kPp) ==
        G{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
  // Flattened views: members row-major over (dp_shard, cp), so group rank = dp_shard * cp + cp_rank.
  CHECK(tp::mesh_groups(d, tp::MeshDim::kDpShardCp) == G{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  CHECK(tp::mesh_groups(d, tp::MeshDim::kDpCp) == tp::mesh_groups(d, tp::MeshDim::kDpShardCp));  // dp_replicate 1
  CHECK(tp::mesh_groups(d, tp::MeshDim::kDp) == tp::mesh_groups(d, tp::MeshDim::kDpShard));
}

TEST_CASE("a single process's mesh has every dimension of size 1 and no communicator", "[parallel]") {
  tp::DeviceMesh mesh(nullptr, tp::resolve_parallel_dims(1, -1, 1, 1, 1, 1));
  for (tp::MeshDim dim : {tp::MeshDim::kPp, tp::MeshDim::kDpReplicate, tp::MeshDim::kDpShard, tp::MeshDim::kCp,
                          tp::MeshDim::kTp, tp::MeshDim::kDp, tp::MeshDim::kDpShardCp, tp::MeshDim::kDpCp}) {
    INFO(tp::mesh_dim_name(dim));
    CHECK(mesh.comm(dim) == nullptr);
    CHECK(mesh.size(dim) == 1);
    CHECK(mesh.local_rank(dim) == 0);
  }
}

TEST_CASE("with cp 1 the flattened views share the communicators of dp_shard and dp (threads)", "[parallel]") {
  // HSDP 2 x 2: dp_shard_cp is dp_shard, dp_cp is dp; no extra process group is built.
  const tp::ParallelDims dims = tp::resolve_parallel_dims(2, 2, 1, 1, 1, 4);
  const std::chrono::milliseconds timeout(30000);
  const auto errors = titan::testing::run_ranks_on_threads(
      4, timeout, [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
        tp::CommOptions opts;
        opts.timeout = timeout;
        tp::DeviceMesh mesh(std::make_unique<tp::Comm>(store, rank, 4, "world", opts), dims);
        auto expect = [&](bool ok, const std::string& what) {
          if (!ok) throw std::runtime_error("rank " + std::to_string(rank) + ": " + what);
        };
        expect(mesh.comm(tp::MeshDim::kDpShardCp) == mesh.comm(tp::MeshDim::kDpShard), "dp_shard_cp != dp_shard");
        expect(mesh.comm(tp::MeshDim::kDpCp) == mesh.comm(tp::MeshDim::kDp), "dp_cp != dp");
        expect(mesh.comm(tp::MeshDim::kDp) != nullptr && mesh.comm(tp::MeshDim::kDp)->size() == 4, "dp size");
        expect(mesh.comm(tp::MeshDim::kCp) == nullptr && mesh.comm(tp::MeshDim::kPp) == nullptr, "cp/pp comm");
        expect(mesh.local_rank(tp::MeshDim::kDpCp) == rank, "dp_cp rank");  // tp 1: dp_cp covers the world
        expect(mesh.local_rank(tp::MeshDim::kDpShardCp) == rank % 2, "dp_shard_cp rank");
      });
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank << ": " << errors[rank]);
    CHECK(errors[rank].empty());
  }
}

TEST_CASE("schedule actions read and print as torchtitan's CSV writes them", "[parallel][schedule]") {
  const tp::Action a = tp::parse_action("0F1");
  CHECK((a.stage == 0 && a.type == tp::ActionType::kForward && a.microbatch == 1));
  CHECK(tp::parse_action("12B345").str() == "12B345");
  CHECK(tp::parse_action("3B0") == tp::Action{3, tp::ActionType::kBackward, 0});
  for (const char* bad : {"", "F1", "0X1", "0F", "0F1x", "-1F0", "0f1", "1234567F0"}) {
    INFO("'" << bad << "'");
    CHECK_THROWS_WITH(tp::parse_action(bad), Contains(std::string("'") + bad + "'") && Contains("<stage><F|B><micro-batch>"));
  }
  // Gradient accumulation is the one-stage schedule: each backward right after its forward.
  std::string text;
  for (const tp::Action& action : tp::single_stage_actions(3)) text += action.str() + " ";
  CHECK(text == "0F0 0B0 0F1 0B1 0F2 0B2 ");
}

TEST_CASE("the sequence split is the identity without context parallelism", "[parallel]") {
  tp::DeviceMesh mesh(nullptr, tp::resolve_parallel_dims(1, -1, 1, 1, 1, 1));
  const titan::model::RotaryTable table = titan::model::make_rotary_table(8, 16, 10000.0, c10::kCPU);
  const at::Tensor inputs = at::arange(12, at::kLong).view({2, 6});
  const at::Tensor labels = inputs + 1;
  const tp::SequenceShard shard = tp::shard_sequence(mesh, inputs, labels, table);
  CHECK(at::equal(shard.inputs, inputs));
  CHECK(at::equal(shard.labels, labels));
  // Every position, in order: the table's first S rows.
  CHECK(shard.rope.cos.size(0) == 6);
  CHECK(at::equal(shard.rope.cos, table.cos.narrow(0, 0, 6)));
  CHECK(at::equal(shard.rope.sin, table.sin.narrow(0, 0, 6)));
  const at::Tensor too_long = at::arange(17, at::kLong).view({1, 17});
  CHECK_THROWS_WITH(tp::shard_sequence(mesh, too_long, too_long, table),
                    "sequence length 17 exceeds the RoPE table (16 positions = model max_seq_len)");
}
