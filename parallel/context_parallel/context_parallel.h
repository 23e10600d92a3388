// parallel/context_parallel/context_parallel.h — context parallelism (CP): each rank of a cp group computes a
// load-balanced share of every sequence, and attention exchanges keys and values (or heads)
// within the group. The rest of the model is per token and needs nothing.
//
// Note [Context parallelism]: what CP changes, and where.
//   - the sequence split (shard_sequence, sequence_shard.h): inputs, labels and the RoPE table
//     cut into 2 cp chunks, rank i keeping chunks i and 2cp-1-i (causal work equal on every rank);
//   - attention (apply_cp below -> attention.h): ring attention with either exchange, or titan's
//     head-parallel all-to-all mode;
//   - FSDP shards parameters over dp_shard x cp and reduce-scatters their gradients over it (each cp
//     rank's gradient is the part from its tokens: the sum is the whole sequence's), the loss sum and
//     the token count are summed over dp x cp, the gradient norm over the world as before (mesh.h);
//   - tokens/s counts each token once (the cp ranks of a group share their batch: ParallelDims::
//     non_data_parallel_size).
// The step, the schedule and the checkpoint layout do not change: a run saved at one CP degree
// resumes at any other.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/args.h"

namespace titan::model {
class Transformer;
}

namespace titan::parallel::comm {
class Comm;
}

namespace titan::parallel::context_parallel {

// parallelism.context_parallel_rotate_method.
enum class CpRotateMethod {
  kAllGather,  // "allgather" (torchtitan's default): every rank's K/V gathered at once
  kAllToAll,   // "alltoall" (torchtitan's name): K/V passed around the ring, step by step
  kUlysses,    // "titan_ulysses" (titan's own): head-parallel all-to-alls (DeepSpeed Ulysses)
};
const std::vector<std::string>& cp_rotate_method_names();  // in enum order
const char* cp_rotate_method_name(CpRotateMethod method);
// Throws std::invalid_argument naming the key and the valid values.
CpRotateMethod cp_rotate_method_from_name(const std::string& name);

// Whether a context-parallel degree `cp` can run this model and sequence under tensor-parallel
// degree `tp`: seq_len divisible by 2 cp (two chunks per rank), the local sequence by tp (sequence
// parallel), and for titan_ulysses the local heads by cp. Throws std::invalid_argument naming the
// keys, the numbers and what to choose. cp 1 checks nothing.
void check_cp_degree(const model::ModelArgs& args, int cp, int tp, int64_t seq_len, CpRotateMethod method);

// This rank's load-balanced share of `x` along `dim` (See Note [Context parallelism]): of 2 cp
// equal chunks, chunk `rank` then chunk 2cp-1-`rank`. cp 1: x itself.
at::Tensor cp_shard(const at::Tensor& x, int64_t dim, int cp, int rank);
// The positions that share holds (for tests and messages): rank's chunk, then its mirror.
std::vector<int64_t> cp_positions(int64_t seq_len, int cp, int rank);

// Installs context-parallel attention over `cp` in every block `holds` (empty: all) keeps; the
// start-up plan shows it as "layers.<i>.attention.sdpa: ...".
void apply_cp(model::Transformer& model, comm::Comm& cp, CpRotateMethod method,
              const std::function<bool(const std::string& module)>& holds = {});

}  // namespace titan::parallel::context_parallel
