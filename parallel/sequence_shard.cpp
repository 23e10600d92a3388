// parallel/sequence_shard.cpp — see sequence_shard.h.
#include "parallel/sequence_shard.h"

#include <stdexcept>
#include <string>

#include "parallel/mesh.h"

namespace titan::parallel {

SequenceShard shard_sequence(const DeviceMesh& mesh, const at::Tensor& inputs, const at::Tensor& labels,
                             const model::RotaryTable& rope) {
  const int64_t seq_len = inputs.size(1);
  if (seq_len > rope.cos.size(0))
    throw std::invalid_argument("sequence length " + std::to_string(seq_len) + " exceeds the RoPE table (" +
                                std::to_string(rope.cos.size(0)) + " positions = model max_seq_len)");
  // cp = 1 (resolve_parallel_dims refuses more): every position on every rank.
  (void)mesh;
  return {inputs, labels, {rope.cos.narrow(0, 0, seq_len), rope.sin.narrow(0, 0, seq_len)}};
}

}  // namespace titan::parallel
