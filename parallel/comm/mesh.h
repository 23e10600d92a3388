// parallel/comm/mesh.h — the device mesh: the job's ranks laid out as a grid of torchtitan's five
// dimensions, outermost first [pp, dp_replicate, dp_shard, cp, tp], with one Comm per dimension
// and per flattened view of several.
//
//   rank = (((pp_rank * dp_replicate + dp_replicate_rank) * dp_shard + dp_shard_rank) * cp
//           + cp_rank) * tp + tp_rank
//
// TP groups are neighbouring ranks (on GPUs: the same node, the fastest links); CP next, then
// FSDP groups stride over them; HSDP replicas and pipeline stages are the outermost. The
// flattened views are what the plan reduces over (as torchtitan's ParallelDims):
//   dp          = dp_replicate x dp_shard        the batch split (data loading, tokens)
//   dp_shard_cp = dp_shard x cp                  FSDP shards parameters over it
//   dp_cp       = dp_replicate x dp_shard x cp   the loss sum and its token count
// and "world" carries the global grad norm. A Comm exists for every dimension of size > 1; a
// flattened view whose extra dimension has size 1 shares the Comm of the view without it
// (dp_shard_cp is dp_shard while cp = 1). Every rank builds every group it belongs to, in one
// fixed order, through Comm::new_group — so the same code runs under titan-run, torchrun and srun.
//
// Note [Expert mesh]: expert parallelism (ep > 1) borrows ranks instead of adding a dimension
// (torchtitan's sparse mesh). Within one (pp, dp_replicate) block the ranks of dp_shard x cp x tp,
// in mesh order, are read again as efsdp x ep x etp (etp = tp or 1):
//   b = (dp_shard_rank * cp + cp_rank) * tp + tp_rank = (efsdp_rank * ep + ep_rank) * etp + etp_rank
// so an EP group is ep neighbouring (dp_shard, cp) coordinates (and the tp ranks too when etp = 1),
// and efsdp = dp_shard * cp * tp / (ep * etp) are the ranks that hold the same experts: FSDP shards
// the experts over them (and HSDP replicas sum their gradients over dp_replicate).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace titan::parallel::comm {

// The degrees of every parallel dimension, resolved and checked against the world size.
struct ParallelDims {
  int pp = 1;
  int dp_replicate = 1;
  int dp_shard = 1;
  int cp = 1;
  int tp = 1;
  int ep = 1;   // expert parallel: borrowed from dp_shard x cp (x tp when etp = 1), Note [Expert mesh]
  int etp = 1;  // expert tensor parallel: 1 or tp (meaningful when ep > 1)
  int world_size = 1;

  int dp() const { return dp_replicate * dp_shard; }           // batch split (data loading)
  int dp_shard_cp() const { return dp_shard * cp; }            // FSDP's shard group
  int dp_cp() const { return dp_replicate * dp_shard * cp; }   // loss / token-count reduction
  int efsdp() const { return dp_shard * cp * tp / (ep * etp); }  // ranks holding the same experts
  // What tokens/s is divided by: ranks that see the same tokens (torchtitan's
  // non_data_parallel_size).
  int non_data_parallel_size() const { return pp * cp * tp; }
  // "pp 1 x dp_replicate 1 x dp_shard 2 x cp 1 x tp 2 = 4 ranks" (+ "; ep 2 x etp 1 over efsdp 1")
  std::string describe() const;
};

// Resolves data_parallel_shard_degree -1 ("the rest") and checks the product against the world
// size. Throws std::invalid_argument with the numbers, as torchtitan words it:
//   "Invalid parallel dims: dp_replicate(2) * dp_shard(2) * cp(1) * tp(2) * pp(1) != WORLD_SIZE(10)".
// ep / etp (Note [Expert mesh]): etp must be 1 or tp, and ep must divide the ranks it borrows.
ParallelDims resolve_parallel_dims(int64_t dp_replicate, int64_t dp_shard, int64_t tp,
                                   int64_t pp, int64_t cp, int world_size, int64_t ep = 1, int64_t etp = 1);

// This rank's coordinate on each mesh dimension.
struct MeshCoord {
  int pp = 0;
  int dp_replicate = 0;
  int dp_shard = 0;
  int cp = 0;
  int tp = 0;
};
MeshCoord mesh_coord(const ParallelDims& dims, int rank);
int mesh_rank(const ParallelDims& dims, const MeshCoord& coord);

// The five dimensions, then the flattened views of several of them, then the expert mesh's
// two (Note [Expert mesh]).
enum class MeshDim { kPp, kDpReplicate, kDpShard, kCp, kTp, kDp, kDpShardCp, kDpCp, kEp, kEfsdp };
// "pp", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp", "ep", "efsdp"
const char* mesh_dim_name(MeshDim dim);

// The global ranks of every group along `dim`, groups in ascending order of their first rank.
// Each inner vector lists the members in group-rank order (a flattened view: row-major over
// its dimensions in mesh order).
std::vector<std::vector<int>> mesh_groups(const ParallelDims& dims, MeshDim dim);

class DeviceMesh {
 public:
  // Builds the per-dimension Comms from `world` (every rank of the job must call this). A
  // single process passes a null `world` (dims of world size 1): then no dimension has a Comm
  // and every stage of the parallel plan is a no-op.
  DeviceMesh(std::unique_ptr<Comm> world, ParallelDims dims);
  ~DeviceMesh();

  const ParallelDims& dims() const { return dims_; }
  const MeshCoord& coord() const { return coord_; }
  int rank() const { return world_ ? world_->rank() : 0; }

  Comm* world() { return world_.get(); }  // nullptr for a single process
  // nullptr when the dimension has size 1 (no communication needed along it).
  Comm* comm(MeshDim dim);
  int size(MeshDim dim) const;
  int local_rank(MeshDim dim) const;  // this rank's coordinate along `dim`

  // Seconds of all this mesh's Comms' collectives, issue to completion, and of those the time
  // spent blocked in wait() (See Note [Asynchronous collectives] in process_group.h).
  double comm_seconds() const;
  double comm_exposed_seconds() const;
  // comm_seconds() per Comm, by its dimension's name ("tp", "dp_shard", "ep", ...; a flattened
  // view that shares another's Comm is counted under that one), the world group's as "world".
  std::map<std::string, double> comm_seconds_by_dim() const;

 private:
  double sum_over_comms(double (Comm::*seconds)() const) const;
  std::unique_ptr<Comm> world_;
  ParallelDims dims_;
  MeshCoord coord_;
  // One slot per MeshDim (indexed by its value); empty for size 1 and for a flattened view that
  // shares another's Comm (comm() follows the alias).
  std::vector<std::unique_ptr<Comm>> comms_;
};

}  // namespace titan::parallel::comm
