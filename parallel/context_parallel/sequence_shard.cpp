// parallel/context_parallel/sequence_shard.cpp — see sequence_shard.h.
#include "parallel/context_parallel/sequence_shard.h"

#include <stdexcept>
#include <string>

#include "model/attention_masks.h"
#include "parallel/context_parallel/context_parallel.h"
#include "parallel/comm/mesh.h"

namespace titan::parallel::context_parallel {

SequenceShard shard_sequence(const comm::DeviceMesh& mesh, const at::Tensor& inputs, const at::Tensor& labels,
                             const model::ModelArgs& args, const model::RotaryTable& rope) {
  const int64_t seq_len = inputs.size(1);
  if (seq_len > rope.cos.size(0))
    throw std::invalid_argument("sequence length " + std::to_string(seq_len) + " exceeds the RoPE table (" +
                                std::to_string(rope.cos.size(0)) + " positions = model max_seq_len)");
  // Load-balanced chunks i and 2cp-1-i of everything indexed by position (identity at cp 1).
  const int cp = mesh.size(comm::MeshDim::kCp), rank = mesh.local_rank(comm::MeshDim::kCp);
  return {cp_shard(inputs, 1, cp, rank), cp_shard(labels, 1, cp, rank),
          {cp_shard(rope.cos.narrow(0, 0, seq_len), 0, cp, rank), cp_shard(rope.sin.narrow(0, 0, seq_len), 0, cp, rank)},
          model::row_documents(args, inputs)};
}

}  // namespace titan::parallel::context_parallel
