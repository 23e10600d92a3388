// parallel/context_parallel/context_parallel.cpp — see context_parallel.h.
#include "parallel/context_parallel/context_parallel.h"
#include "model/param_path.h"

#include <ATen/ops/cat.h>

#include <memory>
#include <sstream>
#include <stdexcept>

#include "model/transformer.h"
#include "parallel/context_parallel/attention.h"
#include "parallel/comm/process_group.h"

namespace titan::parallel::context_parallel {

const std::vector<std::string>& cp_rotate_method_names() {
  static const std::vector<std::string> names = {"allgather", "alltoall", "titan_ulysses"};
  return names;
}

const char* cp_rotate_method_name(CpRotateMethod method) {
  return cp_rotate_method_names()[static_cast<size_t>(method)].c_str();
}

CpRotateMethod cp_rotate_method_from_name(const std::string& name) {
  const auto& names = cp_rotate_method_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<CpRotateMethod>(i);
  throw std::invalid_argument("parallelism.context_parallel_rotate_method '" + name +
                              "' (valid: allgather, alltoall, titan_ulysses)");
}

void check_cp_degree(const model::ModelArgs& args, int cp, int tp, int64_t seq_len, CpRotateMethod method) {
  if (cp <= 1) return;
  std::ostringstream os;
  if (seq_len % (2 * cp) != 0) {
    os << "context parallel: training.seq_len " << seq_len << " is not divisible by 2 x "
       << "parallelism.context_parallel_degree = " << 2 * cp
       << " (the load-balanced causal split gives every rank two equal chunks); choose a seq_len that is a multiple of "
       << 2 * cp;
    throw std::invalid_argument(os.str());
  }
  if (tp > 1 && (seq_len / cp) % tp != 0) {
    os << "context parallel x tensor parallel: each rank's share of the sequence, training.seq_len " << seq_len
       << " / parallelism.context_parallel_degree " << cp << " = " << seq_len / cp
       << ", is not divisible by parallelism.tensor_parallel_degree " << tp
       << " (sequence parallel splits it again); choose a seq_len that is a multiple of " << 2 * cp * tp;
    throw std::invalid_argument(os.str());
  }
  const int64_t local_heads = args.n_heads / tp;
  if (method == CpRotateMethod::kUlysses && local_heads % cp != 0) {
    os << "context parallel: parallelism.context_parallel_rotate_method titan_ulysses splits the attention heads over "
       << "the cp ranks, but " << (tp > 1 ? "each tensor-parallel rank's " : "the model's ") << local_heads
       << " heads (n_heads " << args.n_heads << (tp > 1 ? " / tensor_parallel_degree " + std::to_string(tp) : "")
       << ") are not divisible by parallelism.context_parallel_degree " << cp
       << "; use allgather or alltoall (ring attention), or a degree that divides the heads";
    throw std::invalid_argument(os.str());
  }
}

at::Tensor cp_shard(const at::Tensor& x, int64_t dim, int cp, int rank) {
  if (cp <= 1) return x;
  const int64_t len = x.size(dim);
  if (len % (2 * cp) != 0)
    throw std::invalid_argument("context parallel: a sequence of " + std::to_string(len) +
                                " positions cannot be cut into 2 x " + std::to_string(cp) + " equal chunks");
  const int64_t c = len / (2 * cp);
  return at::cat({x.narrow(dim, rank * c, c), x.narrow(dim, (2 * cp - 1 - rank) * c, c)}, dim);
}

std::vector<int64_t> cp_positions(int64_t seq_len, int cp, int rank) {
  const int64_t c = seq_len / (2 * cp);
  std::vector<int64_t> positions;
  for (int64_t chunk : {int64_t{rank}, int64_t{2 * cp - 1 - rank}})
    for (int64_t i = 0; i < c; ++i) positions.push_back(chunk * c + i);
  if (cp <= 1) positions.resize(static_cast<size_t>(seq_len));
  return positions;
}

void apply_cp(model::Transformer& model, comm::Comm& cp, CpRotateMethod method,
              const std::function<bool(const std::string& module)>& holds) {
  // One tag counter per rank's model: every rank of the group runs the same layers in the same
  // order, so the counters agree (See RingTags).
  auto tags = std::make_shared<RingTags>();
  const std::string name = std::string(method == CpRotateMethod::kUlysses ? "head_all_to_all" : "ring") + "(cp " +
                           std::to_string(cp.size()) + ", " + cp_rotate_method_name(method) + ")";
  for (model::TransformerBlock* block : model.blocks()) {
    if (holds && !holds(block->path)) continue;
    model::AttentionModule& a = *block->attention;
    a.sdpa_name = name;
    comm::Comm* comm = &cp;
    if (method == CpRotateMethod::kUlysses) {
      a.sdpa = [comm](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& documents,
                      std::optional<double> scale, int64_t window, const at::Tensor& sinks) {
        return head_parallel_attention(q, k, v, documents, *comm, scale, window, sinks);
      };
    } else {
      const KvExchange exchange = method == CpRotateMethod::kAllGather ? KvExchange::kAllGather : KvExchange::kRing;
      a.sdpa = [comm, exchange, tags](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& documents, std::optional<double> scale, int64_t window,
                                      const at::Tensor& sinks) {
        return ring_attention(q, k, v, documents, *comm, exchange, *tags, scale, window, sinks);
      };
    }
  }
}

}  // namespace titan::parallel::context_parallel
