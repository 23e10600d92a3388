// parallel/mesh.cpp — see mesh.h.
#include "parallel/mesh.h"

#include <sstream>
#include <stdexcept>

namespace titan::parallel {

std::string ParallelDims::describe() const {
  std::ostringstream os;
  os << "dp_replicate " << dp_replicate << " x dp_shard " << dp_shard << " x tp " << tp << " = "
     << world_size << " rank" << (world_size == 1 ? "" : "s");
  return os.str();
}

ParallelDims resolve_parallel_dims(int64_t dp_replicate, int64_t dp_shard, int64_t tp,
                                   int64_t pp, int64_t cp, int world_size) {
  if (pp > 1)
    throw std::invalid_argument("parallelism.pipeline_parallel_degree = " + std::to_string(pp) +
                                " is not supported by titan (only 1)");
  if (cp > 1)
    throw std::invalid_argument("parallelism.context_parallel_degree = " + std::to_string(cp) +
                                " is not supported by titan (only 1)");
  if (dp_replicate < 1 || tp < 1 || (dp_shard < 1 && dp_shard != -1) || world_size < 1) {
    std::ostringstream os;
    os << "Invalid parallel dims: dp_replicate(" << dp_replicate << "), dp_shard(" << dp_shard
       << "), tp(" << tp << ") must be >= 1 (dp_shard may be -1), WORLD_SIZE(" << world_size
       << ")";
    throw std::invalid_argument(os.str());
  }
  if (dp_shard == -1) {
    if (world_size % (dp_replicate * tp) != 0) {
      std::ostringstream os;
      os << "Invalid parallel dims: WORLD_SIZE(" << world_size << ") is not divisible by "
         << "dp_replicate(" << dp_replicate << ") * tp(" << tp
         << "), so data_parallel_shard_degree -1 has no value";
      throw std::invalid_argument(os.str());
    }
    dp_shard = world_size / (dp_replicate * tp);
  }
  if (dp_replicate * dp_shard * tp != world_size) {
    std::ostringstream os;
    os << "Invalid parallel dims: dp_replicate(" << dp_replicate << ") * dp_shard(" << dp_shard
       << ") * tp(" << tp << ") != WORLD_SIZE(" << world_size << ")";
    throw std::invalid_argument(os.str());
  }
  ParallelDims d;
  d.dp_replicate = static_cast<int>(dp_replicate);
  d.dp_shard = static_cast<int>(dp_shard);
  d.tp = static_cast<int>(tp);
  d.world_size = world_size;
  return d;
}

MeshCoord mesh_coord(const ParallelDims& d, int rank) {
  MeshCoord c;
  c.tp = rank % d.tp;
  c.dp_shard = (rank / d.tp) % d.dp_shard;
  c.dp_replicate = rank / (d.tp * d.dp_shard);
  return c;
}

int mesh_rank(const ParallelDims& d, const MeshCoord& c) {
  return (c.dp_replicate * d.dp_shard + c.dp_shard) * d.tp + c.tp;
}

const char* mesh_dim_name(MeshDim dim) {
  switch (dim) {
    case MeshDim::kDpReplicate: return "dp_replicate";
    case MeshDim::kDpShard: return "dp_shard";
    case MeshDim::kTp: return "tp";
    case MeshDim::kDp: return "dp";
  }
  return "?";
}

std::vector<std::vector<int>> mesh_groups(const ParallelDims& d, MeshDim dim) {
  std::vector<std::vector<int>> groups;
  std::vector<bool> seen(static_cast<size_t>(d.world_size), false);
  for (int r = 0; r < d.world_size; ++r) {
    if (seen[static_cast<size_t>(r)]) continue;
    const MeshCoord base = mesh_coord(d, r);
    std::vector<int> members;
    auto add = [&](MeshCoord c) {
      const int m = mesh_rank(d, c);
      members.push_back(m);
      seen[static_cast<size_t>(m)] = true;
    };
    switch (dim) {
      case MeshDim::kTp:
        for (int t = 0; t < d.tp; ++t) add({base.dp_replicate, base.dp_shard, t});
        break;
      case MeshDim::kDpShard:
        for (int s = 0; s < d.dp_shard; ++s) add({base.dp_replicate, s, base.tp});
        break;
      case MeshDim::kDpReplicate:
        for (int p = 0; p < d.dp_replicate; ++p) add({p, base.dp_shard, base.tp});
        break;
      case MeshDim::kDp:
        for (int p = 0; p < d.dp_replicate; ++p)
          for (int s = 0; s < d.dp_shard; ++s) add({p, s, base.tp});
        break;
    }
    groups.push_back(std::move(members));
  }
  return groups;
}

DeviceMesh::DeviceMesh(std::unique_ptr<Comm> world, ParallelDims dims)
    : world_(std::move(world)), dims_(dims) {
  if (!world_) {  // one process: every dimension has size 1 and no communicator
    if (dims_.world_size != 1)
      throw CommError("device mesh " + dims_.describe() + " needs a process group of " +
                      std::to_string(dims_.world_size) + " ranks");
    return;
  }
  if (world_->size() != dims_.world_size) {
    std::ostringstream os;
    os << "[rank " << world_->rank() << "] device mesh " << dims_.describe()
       << " does not match the world group of " << world_->size() << " ranks";
    throw CommError(os.str());
  }
  coord_ = mesh_coord(dims_, world_->rank());
  // Fixed order on every rank (see mesh.h); a rank only joins the groups it is a member of.
  auto build = [&](MeshDim dim, std::unique_ptr<Comm>& slot) {
    if (size(dim) <= 1) return;
    const auto groups = mesh_groups(dims_, dim);
    for (size_t g = 0; g < groups.size(); ++g) {
      auto comm = world_->new_group(groups[g], std::string(mesh_dim_name(dim)) + "/" +
                                                   std::to_string(g));
      if (comm) slot = std::move(comm);
    }
  };
  build(MeshDim::kTp, tp_);
  build(MeshDim::kDpShard, dp_shard_);
  build(MeshDim::kDpReplicate, dp_replicate_);
  build(MeshDim::kDp, dp_);
}

DeviceMesh::~DeviceMesh() = default;

Comm* DeviceMesh::comm(MeshDim dim) {
  switch (dim) {
    case MeshDim::kDpReplicate: return dp_replicate_.get();
    case MeshDim::kDpShard: return dp_shard_.get();
    case MeshDim::kTp: return tp_.get();
    case MeshDim::kDp: return dp_.get();
  }
  return nullptr;
}

int DeviceMesh::size(MeshDim dim) const {
  switch (dim) {
    case MeshDim::kDpReplicate: return dims_.dp_replicate;
    case MeshDim::kDpShard: return dims_.dp_shard;
    case MeshDim::kTp: return dims_.tp;
    case MeshDim::kDp: return dims_.dp();
  }
  return 1;
}

int DeviceMesh::local_rank(MeshDim dim) const {
  switch (dim) {
    case MeshDim::kDpReplicate: return coord_.dp_replicate;
    case MeshDim::kDpShard: return coord_.dp_shard;
    case MeshDim::kTp: return coord_.tp;
    case MeshDim::kDp: return coord_.dp_replicate * dims_.dp_shard + coord_.dp_shard;
  }
  return 0;
}

double DeviceMesh::sum_over_comms(double (Comm::*seconds)() const) const {
  double s = 0;
  for (const auto* c : {&world_, &dp_replicate_, &dp_shard_, &tp_, &dp_})
    if (*c) s += ((**c).*seconds)();
  return s;
}

double DeviceMesh::comm_seconds() const { return sum_over_comms(&Comm::total_seconds); }
double DeviceMesh::comm_exposed_seconds() const { return sum_over_comms(&Comm::exposed_seconds); }

}  // namespace titan::parallel
