// parallel/comm/mesh.cpp — see mesh.h.
#include "parallel/comm/mesh.h"

#include <iterator>
#include <sstream>
#include <stdexcept>

namespace titan::parallel::comm {

namespace {

// The five dimensions in mesh order, outermost first, and each one's size and coordinate.
constexpr MeshDim kMeshOrder[] = {MeshDim::kPp, MeshDim::kDpReplicate, MeshDim::kDpShard, MeshDim::kCp,
                                  MeshDim::kTp};

int& coord_of(MeshCoord& c, MeshDim dim) {
  switch (dim) {
    case MeshDim::kPp: return c.pp;
    case MeshDim::kDpReplicate: return c.dp_replicate;
    case MeshDim::kDpShard: return c.dp_shard;
    case MeshDim::kCp: return c.cp;
    default: return c.tp;
  }
}

int size_of(const ParallelDims& d, MeshDim dim) {
  switch (dim) {
    case MeshDim::kPp: return d.pp;
    case MeshDim::kDpReplicate: return d.dp_replicate;
    case MeshDim::kDpShard: return d.dp_shard;
    case MeshDim::kCp: return d.cp;
    default: return d.tp;
  }
}

// The dimensions a (possibly flattened) MeshDim spans, in mesh order.
std::vector<MeshDim> spanned_dims(MeshDim dim) {
  switch (dim) {
    case MeshDim::kDp: return {MeshDim::kDpReplicate, MeshDim::kDpShard};
    case MeshDim::kDpShardCp: return {MeshDim::kDpShard, MeshDim::kCp};
    case MeshDim::kDpCp: return {MeshDim::kDpReplicate, MeshDim::kDpShard, MeshDim::kCp};
    default: return {dim};
  }
}

// A flattened view whose added dimension has size 1 is the same group as the view without it
// (See mesh.h): the Comm it shares, or `dim` itself.
MeshDim comm_owner(const ParallelDims& d, MeshDim dim) {
  if (d.cp == 1 && dim == MeshDim::kDpShardCp) return MeshDim::kDpShard;
  if (d.cp == 1 && dim == MeshDim::kDpCp) return MeshDim::kDp;
  return dim;
}

bool expert_dim(MeshDim dim) { return dim == MeshDim::kEp || dim == MeshDim::kEfsdp; }

// A rank's coordinates on the expert mesh (Note [Expert mesh]): its (pp, dp_replicate) block and
// its efsdp, ep and etp ranks within it.
struct ExpertCoord {
  int block = 0, efsdp = 0, ep = 0, etp = 0;
};
ExpertCoord expert_coord(const ParallelDims& d, int rank) {
  const int inner = d.dp_shard * d.cp * d.tp;
  const int b = rank % inner;
  return {rank / inner, b / (d.etp * d.ep), (b / d.etp) % d.ep, b % d.etp};
}
int expert_rank(const ParallelDims& d, const ExpertCoord& c) {
  return c.block * d.dp_shard * d.cp * d.tp + (c.efsdp * d.ep + c.ep) * d.etp + c.etp;
}

}  // namespace

std::string ParallelDims::describe() const {
  std::ostringstream os;
  os << "pp " << pp << " x dp_replicate " << dp_replicate << " x dp_shard " << dp_shard << " x cp " << cp
     << " x tp " << tp << " = " << world_size << " rank" << (world_size == 1 ? "" : "s");
  if (ep > 1) os << "; ep " << ep << " x etp " << etp << " over efsdp " << efsdp();
  return os.str();
}

ParallelDims resolve_parallel_dims(int64_t dp_replicate, int64_t dp_shard, int64_t tp,
                                   int64_t pp, int64_t cp, int world_size, int64_t ep, int64_t etp) {
  auto product = [&](int64_t shard) {
    std::ostringstream os;
    os << "dp_replicate(" << dp_replicate << ") * dp_shard(" << shard << ") * cp(" << cp << ") * tp(" << tp
       << ") * pp(" << pp << ")";
    return os.str();
  };
  if (dp_replicate < 1 || tp < 1 || pp < 1 || cp < 1 || (dp_shard < 1 && dp_shard != -1) || world_size < 1)
    throw std::invalid_argument("Invalid parallel dims: " + product(dp_shard) +
                                ": every degree must be >= 1 (dp_shard may be -1), WORLD_SIZE(" +
                                std::to_string(world_size) + ")");
  if (dp_shard == -1) {
    const int64_t others = dp_replicate * cp * tp * pp;
    if (world_size % others != 0) {
      std::ostringstream os;
      os << "Invalid parallel dims: WORLD_SIZE(" << world_size << ") is not divisible by dp_replicate("
         << dp_replicate << ") * cp(" << cp << ") * tp(" << tp << ") * pp(" << pp
         << "), so data_parallel_shard_degree -1 has no value";
      throw std::invalid_argument(os.str());
    }
    dp_shard = world_size / others;
  }
  if (dp_replicate * dp_shard * cp * tp * pp != world_size)
    throw std::invalid_argument("Invalid parallel dims: " + product(dp_shard) + " != WORLD_SIZE(" +
                                std::to_string(world_size) + ")");
  ParallelDims d;
  d.pp = static_cast<int>(pp);
  d.dp_replicate = static_cast<int>(dp_replicate);
  d.dp_shard = static_cast<int>(dp_shard);
  d.cp = static_cast<int>(cp);
  d.tp = static_cast<int>(tp);
  d.world_size = world_size;
  if (ep < 1 || etp < 1)
    throw std::invalid_argument("Invalid expert parallel dims: expert_parallel_degree(" + std::to_string(ep) +
                                ") and expert_tensor_parallel_degree(" + std::to_string(etp) + ") must be >= 1");
  if (ep > 1) {
    if (etp != 1 && etp != tp)
      throw std::invalid_argument("Invalid expert parallel dims: expert_tensor_parallel_degree(" + std::to_string(etp) +
                                  ") must be 1 or tensor_parallel_degree(" + std::to_string(tp) +
                                  ") when expert_parallel_degree > 1");
    const int64_t borrowed = dp_shard * cp * tp / etp;  // Note [Expert mesh]
    if (borrowed % ep != 0) {
      std::ostringstream os;
      os << "Invalid expert parallel dims: expert_parallel_degree(" << ep << ") must divide the ranks it borrows, dp_shard("
         << dp_shard << ") * cp(" << cp << ")" << (etp == 1 && tp > 1 ? " * tp(" + std::to_string(tp) + ")" : "")
         << " = " << borrowed;
      throw std::invalid_argument(os.str());
    }
    d.ep = static_cast<int>(ep);
    d.etp = static_cast<int>(etp);
  }
  return d;
}

MeshCoord mesh_coord(const ParallelDims& d, int rank) {
  MeshCoord c;
  for (auto it = std::rbegin(kMeshOrder); it != std::rend(kMeshOrder); ++it) {  // innermost first
    coord_of(c, *it) = rank % size_of(d, *it);
    rank /= size_of(d, *it);
  }
  return c;
}

int mesh_rank(const ParallelDims& d, const MeshCoord& c) {
  int rank = 0;
  MeshCoord coord = c;
  for (MeshDim dim : kMeshOrder) rank = rank * size_of(d, dim) + coord_of(coord, dim);
  return rank;
}

const char* mesh_dim_name(MeshDim dim) {
  switch (dim) {
    case MeshDim::kPp: return "pp";
    case MeshDim::kDpReplicate: return "dp_replicate";
    case MeshDim::kDpShard: return "dp_shard";
    case MeshDim::kCp: return "cp";
    case MeshDim::kTp: return "tp";
    case MeshDim::kDp: return "dp";
    case MeshDim::kDpShardCp: return "dp_shard_cp";
    case MeshDim::kDpCp: return "dp_cp";
    case MeshDim::kEp: return "ep";
    case MeshDim::kEfsdp: return "efsdp";
  }
  return "?";
}

std::vector<std::vector<int>> mesh_groups(const ParallelDims& d, MeshDim dim) {
  if (expert_dim(dim)) {  // vary one expert coordinate, keep the others
    const bool ep = dim == MeshDim::kEp;
    std::vector<std::vector<int>> groups;
    for (int r = 0; r < d.world_size; ++r) {
      ExpertCoord c = expert_coord(d, r);
      if ((ep ? c.ep : c.efsdp) != 0) continue;
      std::vector<int> members;
      for (int i = 0; i < (ep ? d.ep : d.efsdp()); ++i) {
        (ep ? c.ep : c.efsdp) = i;
        members.push_back(expert_rank(d, c));
      }
      groups.push_back(std::move(members));
    }
    return groups;
  }
  const std::vector<MeshDim> spanned = spanned_dims(dim);
  int group_size = 1;
  for (MeshDim s : spanned) group_size *= size_of(d, s);
  std::vector<std::vector<int>> groups;
  std::vector<bool> seen(static_cast<size_t>(d.world_size), false);
  for (int r = 0; r < d.world_size; ++r) {
    if (seen[static_cast<size_t>(r)]) continue;
    const MeshCoord base = mesh_coord(d, r);
    std::vector<int> members;
    for (int index = 0; index < group_size; ++index) {  // row-major over `spanned`
      MeshCoord c = base;
      int rest = index;
      for (auto it = spanned.rbegin(); it != spanned.rend(); ++it) {
        coord_of(c, *it) = rest % size_of(d, *it);
        rest /= size_of(d, *it);
      }
      const int m = mesh_rank(d, c);
      members.push_back(m);
      seen[static_cast<size_t>(m)] = true;
    }
    groups.push_back(std::move(members));
  }
  return groups;
}

DeviceMesh::DeviceMesh(std::unique_ptr<Comm> world, ParallelDims dims)
    : world_(std::move(world)), dims_(dims), comms_(static_cast<size_t>(MeshDim::kEfsdp) + 1) {
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
  // Fixed order on every rank (see mesh.h); a rank only joins the groups it is a member of. The
  // first four are the order of the two-dimensional mesh titan had before, so their group names
  // and sequence numbers are unchanged; the expert mesh's come last.
  for (MeshDim dim : {MeshDim::kTp, MeshDim::kDpShard, MeshDim::kDpReplicate, MeshDim::kDp, MeshDim::kCp,
                      MeshDim::kDpShardCp, MeshDim::kDpCp, MeshDim::kPp, MeshDim::kEp, MeshDim::kEfsdp}) {
    if (size(dim) <= 1 || comm_owner(dims_, dim) != dim) continue;
    const auto groups = mesh_groups(dims_, dim);
    for (size_t g = 0; g < groups.size(); ++g) {
      auto comm = world_->new_group(groups[g], std::string(mesh_dim_name(dim)) + "/" + std::to_string(g));
      if (comm) comms_[static_cast<size_t>(dim)] = std::move(comm);
    }
  }
}

DeviceMesh::~DeviceMesh() = default;

Comm* DeviceMesh::comm(MeshDim dim) {
  return comms_[static_cast<size_t>(comm_owner(dims_, dim))].get();
}

int DeviceMesh::size(MeshDim dim) const {
  if (dim == MeshDim::kEp) return dims_.ep;
  if (dim == MeshDim::kEfsdp) return dims_.efsdp();
  int n = 1;
  for (MeshDim s : spanned_dims(dim)) n *= size_of(dims_, s);
  return n;
}

int DeviceMesh::local_rank(MeshDim dim) const {
  if (expert_dim(dim)) {
    const ExpertCoord c = expert_coord(dims_, rank());
    return dim == MeshDim::kEp ? c.ep : c.efsdp;
  }
  int index = 0;
  MeshCoord c = coord_;
  for (MeshDim s : spanned_dims(dim)) index = index * size_of(dims_, s) + coord_of(c, s);
  return index;
}

double DeviceMesh::sum_over_comms(double (Comm::*seconds)() const) const {
  double s = world_ ? ((*world_).*seconds)() : 0.0;
  for (const auto& c : comms_)
    if (c) s += ((*c).*seconds)();
  return s;
}

double DeviceMesh::comm_seconds() const { return sum_over_comms(&Comm::total_seconds); }

std::map<std::string, double> DeviceMesh::comm_seconds_by_dim() const {
  std::map<std::string, double> by_dim;
  if (world_) by_dim["world"] = world_->total_seconds();
  for (size_t d = 0; d < comms_.size(); ++d)
    if (comms_[d]) by_dim[mesh_dim_name(static_cast<MeshDim>(d))] = comms_[d]->total_seconds();
  return by_dim;
}
double DeviceMesh::comm_exposed_seconds() const { return sum_over_comms(&Comm::exposed_seconds); }

}  // namespace titan::parallel::comm
